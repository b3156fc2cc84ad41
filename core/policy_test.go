package core

import (
	"reflect"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// answers calls every decision of a policy.
func answers(p policy) map[string]any {
	v := reflect.ValueOf(p)
	m := map[string]any{}
	for i := 0; i < v.NumMethod(); i++ {
		m[v.Type().Method(i).Name] = v.Method(i).Call(nil)[0].Interface()
	}
	return m
}

// Each known-unsafe variant's policy gives the core's own answer at every
// decision but one: the variant breaks one rule, and the unsafe package's
// safe answers are the core's.
func TestEachVariantBreaksOneRule(t *testing.T) {
	safe := answers(safePolicy{})
	if len(safe) != reflect.TypeOf((*policy)(nil)).Elem().NumMethod() {
		t.Fatalf("safePolicy answers %d decisions", len(safe))
	}
	for _, v := range knownunsafe.All {
		p, err := policyFor(v.WithSelfLease(time.Second))
		if err != nil {
			t.Fatalf("%s: %v", v.Name(), err)
		}
		var broken []string
		for name, a := range answers(p) {
			if !reflect.DeepEqual(a, safe[name]) {
				broken = append(broken, name)
			}
		}
		if len(broken) != 1 {
			t.Errorf("%s breaks %v, want exactly one rule", v.Name(), broken)
		}
	}
	if p, _ := policyFor(knownunsafe.Safe); p != (safePolicy{}) {
		t.Fatalf("Safe runs %T", p)
	}
}
