package tier

import (
	"errors"
	"testing"
)

func TestCheckNoBuild(t *testing.T) {
	tests := []struct {
		name string
		spec *Spec
		ok   bool
	}{
		{"a run", &Spec{}, true},
		{"no spec", nil, true},
		{"a build step", &Spec{Build: &BuildSpec{}}, false},
		{"a root build step", &Spec{Build: &BuildSpec{AsRoot: true}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckNoBuild("gvisor", tc.spec)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrUnavailable)) {
				t.Errorf("CheckNoBuild = %v, want ok %v (ErrUnavailable otherwise)", err, tc.ok)
			}
		})
	}
}
