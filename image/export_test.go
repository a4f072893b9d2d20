package image

import "testing"

// For the external tests (build_engine_test.go, package image_test).

var (
	ImagePasswd = imagePasswd
	MountsUnder = mountsUnder
)

func AssertStoreClean(t *testing.T, s *Store, name string, wantBuilds int) {
	t.Helper()
	assertStoreClean(t, s, name, wantBuilds)
}
