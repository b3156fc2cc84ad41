package main

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"

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
	var force bool
	cmd := &cobra.Command{
		Use:   "keygen --private FILE --public FILE",
		Short: "Make an ed25519 key pair (PEM) for kvfence conformance --sign-key and --trusted-key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if private == "" || public == "" {
				return usagef("--private and --public are required")
			}
			return writeKeyPair(private, public, force)
		},
	}
	cmd.Flags().StringVar(&private, "private", "", "where to write the private key (mode 0600)")
	cmd.Flags().StringVar(&public, "public", "", "where to write the public key")
	cmd.Flags().BoolVar(&force, "force", false, "overwrite existing key files")
	return cmd
}

// writeKeyPair writes a new key pair. Both keys to one path would leave
// only the public one; an existing file is kept unless force (a signing key
// overwritten by mistake cannot be had back, and certificates signed with
// it no longer verify against a new public key).
func writeKeyPair(private, public string, force bool) error {
	if samePath(private, public) {
		return usagef("--private and --public name the same file %s: the public key would overwrite the private one", private)
	}
	if !force {
		for _, p := range []string{private, public} {
			if _, err := os.Lstat(p); err == nil {
				return usagef("%s exists: kvfence cert keygen does not overwrite a key without --force", p)
			}
		}
	}
	priv, pub, err := sdk.GenerateSigningKey()
	if err != nil {
		return err
	}
	if err := writeKeyFile(private, priv, 0o600, force); err != nil {
		return err
	}
	return writeKeyFile(public, pub, 0o644, force)
}

// writeKeyFile creates path; without force it refuses one that appeared
// since the check (O_EXCL).
func writeKeyFile(path string, data []byte, mode os.FileMode, force bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if !force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, mode)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil { // an overwritten file keeps its old mode otherwise
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// samePath: a and b name one file (the same clean absolute path, or one
// existing file under two names).
func samePath(a, b string) bool {
	aa, errA := filepath.Abs(a)
	bb, errB := filepath.Abs(b)
	if errA == nil && errB == nil && aa == bb {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
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
			return runCertVerify(cmd, args[0], plugin, trusted, pol)
		},
	}
	f := cmd.Flags()
	f.StringVar(&plugin, "plugin", "", "the plugin binary the certificate must be for")
	f.StringSliceVar(&trusted, "trusted-key", nil, "ed25519 public key (PEM) trusted to sign certificates (repeatable)")
	f.StringSliceVar(&pol.SuiteVersions, "suite-version", []string{conformance.SuiteVersion}, "accepted suite versions")
	f.StringSliceVar(&pol.Profiles, "profile", []string{conformance.ProfileFull}, "accepted profiles")
	return cmd
}

// runCertVerify is kvfence cert verify: the certificate at cert must be
// signed by a trusted key and name plugin's sha256.
func runCertVerify(cmd *cobra.Command, cert, plugin string, trusted []string, pol sdk.CertificatePolicy) error {
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
	file, err := os.ReadFile(cert)
	if err != nil {
		return err
	}
	sum, err := sdk.FileSHA256(plugin)
	if err != nil {
		return err
	}
	claims, err := pol.Verify(file, sum)
	if err != nil {
		return fmt.Errorf("%s: %w", cert, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "valid: %s\n", claims)
	return nil
}
