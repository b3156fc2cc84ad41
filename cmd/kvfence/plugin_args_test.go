package main

import (
	"reflect"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/kvfence/kvfence/sdk"
)

func TestPerHostAdvertisesOneEndpointPerHost(t *testing.T) {
	ep := sdk.Endpoint{Transport: "verbs", Address: "[::]:4791", Opaque: []byte{1}}
	got := perHost(ep, []string{"127.0.0.1", "127.0.0.2"}, hclog.NewNullLogger())
	if len(got) != 2 || got[0].Address != "127.0.0.1:4791" || got[1].Address != "127.0.0.2:4791" ||
		got[1].Transport != "verbs" || len(got[1].Opaque) != 1 {
		t.Fatalf("perHost: %+v", got)
	}
	if got := perHost(sdk.Endpoint{Address: "no-port"}, []string{"h"}, hclog.NewNullLogger()); got != nil {
		t.Fatalf("an address without a port must be advertised as is: %+v", got)
	}
}

func TestDemoPluginArgs(t *testing.T) {
	if a := (demoOptions{}).pluginArgs([]string{"K=V"}); a != nil {
		t.Fatalf("no plugin: %v", a)
	}
	o := demoOptions{Plugin: "/usr/bin/kvfence-plugin-verbs"}
	want := []string{"--plugin", "/usr/bin/kvfence-plugin-verbs", "--plugin-env", "A=1", "--plugin-env", "B=2"}
	if a := o.pluginArgs([]string{"A=1", "B=2"}); !reflect.DeepEqual(a, want) {
		t.Fatalf("pluginArgs: %v", a)
	}
}
