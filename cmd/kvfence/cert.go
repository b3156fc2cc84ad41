package main

import (
	"crypto/ed25519"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/conformance"
	"github.com/kvfence/kvfence/sdk"
)

func init() { register(newCertCommand) }

// newCertCommand makes signing keys and verifies conformance certificates
// the way an agent started with --require-certificate does.
func newCertCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "cert", Short: "Sign and verify conformance certificates", Args: cobra.NoArgs}
	cmd.AddCommand(newCertKeygenCommand(), newCertVerifyCommand())
	return cmd
}

func newCertKeygenCommand() *cobra.Command {
	var private, public string
	cmd := &cobra.Command{
		Use:   "keygen --private FILE --public FILE",
		Short: "Make an ed25519 key pair (PEM) for kvfence conformance --sign-key and --trusted-key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if private == "" || public == "" {
				return usagef("--private and --public are required")
			}
			priv, pub, err := sdk.GenerateSigningKey()
			if err != nil {
				return err
			}
			if err := os.WriteFile(private, priv, 0o600); err != nil {
				return err
			}
			return os.WriteFile(public, pub, 0o644)
		},
	}
	cmd.Flags().StringVar(&private, "private", "", "where to write the private key (mode 0600)")
	cmd.Flags().StringVar(&public, "public", "", "where to write the public key")
	return cmd
}

func newCertVerifyCommand() *cobra.Command {
	var (
		plugin  string
		trusted []string
		pol     sdk.CertificatePolicy
	)
	cmd := &cobra.Command{
		Use:   "verify CERT --plugin BIN --trusted-key PUB",
		Short: "Check a certificate's signature, the binary's sha256, the suite version and the profile",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if plugin == "" || len(trusted) == 0 {
				return usagef("--plugin and at least one --trusted-key are required")
			}
			for _, path := range trusted {
				k, err := sdk.LoadPublicKey(path)
				if err != nil {
					return fmt.Errorf("--trusted-key: %w", err)
				}
				pol.TrustedKeys = append(pol.TrustedKeys, ed25519.PublicKey(k))
			}
			file, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			sum, err := sdk.FileSHA256(plugin)
			if err != nil {
				return err
			}
			claims, err := pol.Verify(file, sum)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "valid: %s\n", claims)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&plugin, "plugin", "", "the plugin binary the certificate must be for")
	f.StringSliceVar(&trusted, "trusted-key", nil, "ed25519 public key (PEM) trusted to sign certificates (repeatable)")
	f.StringSliceVar(&pol.SuiteVersions, "suite-version", []string{conformance.SuiteVersion}, "accepted suite versions")
	f.StringSliceVar(&pol.Profiles, "profile", []string{conformance.ProfileFull}, "accepted profiles")
	return cmd
}
