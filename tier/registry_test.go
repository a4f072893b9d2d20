package tier

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// withRegistry runs the test against an empty registry and restores the
// real one (the tiers this test binary registered, none) afterwards.
func withRegistry(t *testing.T) {
	t.Helper()
	registry.mu.Lock()
	saved := registry.ctors
	registry.ctors = nil
	registry.mu.Unlock()
	t.Cleanup(func() {
		registry.mu.Lock()
		registry.ctors = saved
		registry.mu.Unlock()
	})
}

type fakeTier struct{ name string }

func (f *fakeTier) Name() string               { return f.name }
func (f *fakeTier) Capabilities() Capabilities { return Capabilities{} }
func (f *fakeTier) Prepare(context.Context, *Spec) (Sandbox, error) {
	return nil, ErrUnavailable
}

func fake(name string) Constructor {
	return func(Config) (Tier, error) { return &fakeTier{name}, nil }
}

func TestRegistry(t *testing.T) {
	tests := []struct {
		name      string
		register  []string
		lookup    string
		wantErr   string // empty: found
		wantList  []string
		wantPanic string // part of the panic of the last Register
	}{
		{name: "empty", lookup: "native", wantErr: `tier "native": no such tier in this build; available: `, wantList: []string{}},
		{name: "found", register: []string{"native"}, lookup: "native", wantList: []string{"native"}},
		{name: "unknown names the known ones, sorted", register: []string{"wasm", "native", "gvisor"}, lookup: "nope",
			wantErr: `tier "nope": no such tier in this build; available: gvisor, native, wasm`, wantList: []string{"gvisor", "native", "wasm"}},
		{name: "list sorted", register: []string{"microvm", "wasm", "gvisor", "native"}, lookup: "gvisor", wantList: []string{"gvisor", "microvm", "native", "wasm"}},
		{name: "twice panics", register: []string{"native", "native"}, wantPanic: `tier.Register("native"): registered twice`},
		{name: "empty name panics", register: []string{""}, wantPanic: "empty name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			withRegistry(t)
			var got any
			func() {
				defer func() { got = recover() }()
				for _, n := range tc.register {
					Register(n, fake(n))
				}
			}()
			if tc.wantPanic != "" {
				if s, _ := got.(string); !strings.Contains(s, tc.wantPanic) {
					t.Fatalf("Register panicked with %v, want %q", got, tc.wantPanic)
				}
				return
			}
			if got != nil {
				t.Fatalf("Register panicked: %v", got)
			}
			c, err := Lookup(tc.lookup)
			switch {
			case tc.wantErr != "":
				if err == nil || err.Error() != tc.wantErr || !errors.Is(err, ErrUnknown) {
					t.Errorf("Lookup(%q) = %v, want %q wrapping ErrUnknown", tc.lookup, err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("Lookup(%q): %v", tc.lookup, err)
			default:
				tr, err := c(Config{})
				if err != nil || tr.Name() != tc.lookup {
					t.Errorf("constructor of %q built %v, %v", tc.lookup, tr, err)
				}
			}
			if l := List(); !slices.Equal(l, tc.wantList) {
				t.Errorf("List() = %q, want %q", l, tc.wantList)
			}
		})
	}
}

func TestRegisterNilConstructorPanics(t *testing.T) {
	withRegistry(t)
	defer func() {
		if recover() == nil {
			t.Fatal("Register with a nil constructor did not panic")
		}
	}()
	Register("x", nil)
}
