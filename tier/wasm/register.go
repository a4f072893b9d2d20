package wasm

import (
	"context"
	"fmt"

	"github.com/moat-sandbox/moat/tier"
)

func init() { tier.Register(Name, newFromConfig) }

// newFromConfig is the wasm tier's tier.Constructor. The tier starts no
// host executable, so nothing of the Config applies to it.
func newFromConfig(tier.Config) (tier.Tier, error) {
	w, err := New(Options{})
	if err != nil {
		return nil, err // not a typed nil *WASM in the interface
	}
	return w, nil
}

var _ tier.Describer = (*WASM)(nil)

// Describe implements tier.Describer: the runtime's version and the
// guests' digests.
func (w *WASM) Describe(context.Context) (string, []string, error) {
	g := w.Guests()
	return fmt.Sprintf("%s, guests python sha256:%.12s, js sha256:%.12s", w.Version(), g["python"], g["js"]), nil, nil
}
