package native_test

import (
	"testing"

	"github.com/moat-sandbox/moat/tier/tiertest"
)

// TestSecretThroughRunCA: the run CA's bundle in a native sandbox
// (tiertest.SecretThroughRunCA says what is checked).
func TestSecretThroughRunCA(t *testing.T) {
	needRoot(t)
	n, img, _ := nativeTier(t)
	tiertest.SecretThroughRunCA(t, n, img.Root, img.Env, img.Digest)
}
