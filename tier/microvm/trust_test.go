package microvm_test

import (
	"testing"

	"github.com/moat-sandbox/moat/tier/microvm"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

// TestSecretThroughRunCA: the run CA's bundle in a microVM (the agent
// installs it; tiertest.SecretThroughRunCA says what is checked).
func TestSecretThroughRunCA(t *testing.T) {
	g := need(t, microvm.Options{})
	e := newEngine(t, g)
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	tiertest.SecretThroughRunCA(t, g, img.Root, img.Env, img.Digest)
}
