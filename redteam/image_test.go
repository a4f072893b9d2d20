package redteam

import (
	"testing"

	"github.com/moat-sandbox/moat/manifest"
)

// TestRunnerImage: Options.Image is the image of every manifest a case
// starts from (the default python one when unset).
func TestRunnerImage(t *testing.T) {
	tests := []struct {
		name, image, want string
	}{
		{name: "default", image: "", want: manifest.Default().Image},
		{name: "imported image", image: "redteam-imported", want: "redteam-imported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{image: tc.image}
			if got := r.defaults().Image; got != tc.want {
				t.Errorf("defaults().Image = %q, want %q", got, tc.want)
			}
			if err := r.defaults().Validate(); err != nil {
				t.Errorf("defaults() does not validate: %v", err)
			}
		})
	}
}
