package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvfence/kvfence/conformance"
)

func main() {
	plugin := flag.String("plugin", "", "plugin binary to certify")
	idev := flag.String("initiator-device", "rxe0", "RDMA device of the initiator (KVFENCE_VERBS_DEVICE)")
	tdev := flag.String("target-device", "rxe1", "RDMA device of the target")
	out := flag.String("out", "cert", "directory for the report and certificate")
	groups := flag.String("groups", "", "comma-separated groups (default: all)")
	maxWrite := flag.Uint64("max-write", 0, "largest single write checked (0: the suite's default)")
	timeout := flag.Duration("timeout", 15*time.Minute, "whole run")
	netemDevs := flag.String("netem-dev", "", "comma-separated devices the RDMA traffic crosses, shaped by the netem checks")
	flag.Parse()
	cfg := conformance.Config{
		Plugin:       *plugin,
		InitiatorEnv: []string{"KVFENCE_VERBS_DEVICE=" + *idev},
		TargetEnv:    []string{"KVFENCE_VERBS_DEVICE=" + *tdev},
		Device:       *idev + "->" + *tdev,
		Proxy:        "off", // the proxy would sit on the QP handshake, not on RDMA traffic
		Log:          os.Stderr,
		MaxWriteSize: *maxWrite,
	}
	if *netemDevs != "" {
		cfg.NetemDevices = strings.Split(*netemDevs, ",")
	}
	cfg.Progress = os.Stdout
	if *groups != "" {
		cfg.Groups = strings.Split(*groups, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	r := conformance.Certify(ctx, cfg)
	if err := conformance.Write(*out, r); err != nil {
		fmt.Fprintln(os.Stderr, "write report:", err)
		os.Exit(2)
	}
	for _, g := range r.Groups {
		fmt.Printf("KVF certify group %-14s %s %s\n", g.Name, g.Outcome, g.Skipped)
	}
	for _, f := range r.Failures() {
		fmt.Println("KVF certify FAIL", f)
	}
	for _, sk := range r.Skipped {
		if sk.Required {
			fmt.Println("KVF certify SKIPPED (required)", sk.Check+":", sk.Reason)
		}
	}
	fmt.Printf("KVF certify: passed=%v partial=%v certified=%v in %v, worst tail %s, report in %s\n",
		r.Passed, r.Partial, r.Certified, r.Duration.Round(time.Second), r.WorstTail, *out)
	if !r.Certified { // a required check skipped fails the job as a failed one does
		os.Exit(1)
	}
}
