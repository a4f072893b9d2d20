package e2b

import (
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// The tests' backend and auditor are servicetest's; the auditor knows the
// two keys of keys, and fakeKeys is the key store the E2B handler checks
// revocation against.

var keys = map[string]audit.Key{
	"moat_ka_secret": {ID: "ka", Name: "a"},
	"moat_kb_secret": {ID: "kb", Name: "b"},
	// A token of the form CreateKey gives, which has an E2B spelling.
	keyReal: {ID: "k0123456789ab", Name: "real"},
}

const keyReal = "moat_k0123456789ab_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

// fakeKeys is the key store: every key of keys, some revoked.
type fakeKeys struct {
	mu      sync.Mutex
	revoked map[string]bool
}

func (f *fakeKeys) revoke(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revoked[id] = true
}

func (f *fakeKeys) Key(id string) (audit.Key, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		if k.ID == id {
			if f.revoked[id] {
				now := time.Now()
				k.Revoked = &now
			}
			return k, nil
		}
	}
	return audit.Key{}, audit.ErrBadKey
}
