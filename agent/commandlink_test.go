package agent

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/routerlink"
)

// internalTypes lists the exported fields of t whose type (or a type it is
// built from: func parameters, pointers, slices, maps) lives in an
// internal package: an engine outside this module could not name it.
func internalTypes(t reflect.Type) []string {
	var found []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.IsExported() && namesInternal(f.Type, map[reflect.Type]bool{}) {
			found = append(found, t.Name()+"."+f.Name)
		}
	}
	return found
}

func namesInternal(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	if strings.Contains(t.PkgPath(), "/internal/") || strings.HasSuffix(t.PkgPath(), "/internal") {
		return true
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
		return namesInternal(t.Elem(), seen)
	case reflect.Map:
		return namesInternal(t.Key(), seen) || namesInternal(t.Elem(), seen)
	case reflect.Func:
		for i := 0; i < t.NumIn(); i++ {
			if namesInternal(t.In(i), seen) {
				return true
			}
		}
		for i := 0; i < t.NumOut(); i++ {
			if namesInternal(t.Out(i), seen) {
				return true
			}
		}
	}
	return false
}

// Issue 22, item 4: no exported configuration field has a type an engine
// outside the module cannot name (the router-link handler was one:
// Commands func(routerlink.Link)). The control arm shows the check sees
// such a field.
func TestConfigsExportNoInternalTypes(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeOf(DecodeConfig{}), reflect.TypeOf(PrefillConfig{})} {
		if bad := internalTypes(typ); len(bad) > 0 {
			t.Errorf("exported fields of module-internal types: %v", bad)
		}
	}
	type oldConfig struct{ Commands func(routerlink.Link) }
	if bad := internalTypes(reflect.TypeOf(oldConfig{})); len(bad) != 1 {
		t.Errorf("control arm: an exported func(routerlink.Link) field went unseen (%v)", bad)
	}
}

// routerlink.ServeCommands sets the handler of either configuration and
// refuses anything else, classified.
func TestServeCommandsSetsTheHandler(t *testing.T) {
	serve := func(routerlink.Link) {}
	var d DecodeConfig
	var p PrefillConfig
	if err := routerlink.ServeCommands(&d, serve); err != nil || d.commands == nil {
		t.Errorf("decode: err %v, handler set %v", err, d.commands != nil)
	}
	if err := routerlink.ServeCommands(&p, serve); err != nil || p.commands == nil {
		t.Errorf("prefill: err %v, handler set %v", err, p.commands != nil)
	}
	if err := routerlink.ServeCommands(d, serve); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a config by value: want InvalidArgument, got %v", err)
	}
}
