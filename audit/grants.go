package audit

import (
	"errors"
	"fmt"

	"github.com/moat-sandbox/moat/egress"
)

// GrantSecret lets the key id use the secret name in its manifests.
// Granting twice changes nothing; an unknown key is an error wrapping
// ErrNotFound. The secret need not exist yet: the grant is a name, and a
// run naming a secret the host lacks is refused when it starts.
func (s *Store) GrantSecret(id, name string) error {
	if !egress.ValidSecretName(name) {
		return fmt.Errorf("grant secret %q: not a secret name; want 1 to %d of a-z 0-9 _ -, starting with a letter or digit", name, egress.MaxSecretName)
	}
	if _, err := s.Key(id); err != nil {
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("grant secret %s: no such key %q (moat keys list shows the ids): %w", name, id, ErrNotFound)
		}
		return fmt.Errorf("grant secret %s: %w", name, err)
	}
	if _, err := s.w.Exec(`INSERT OR IGNORE INTO key_secrets (key_id, secret) VALUES (?, ?)`, id, name); err != nil {
		return fmt.Errorf("grant secret %s to key %s: %w", name, id, err)
	}
	return nil
}

// RevokeSecret takes the secret name back from the key id. Taking back a
// secret the key was not granted is an error wrapping ErrNotFound.
func (s *Store) RevokeSecret(id, name string) error {
	res, err := s.w.Exec(`DELETE FROM key_secrets WHERE key_id = ? AND secret = ?`, id, name)
	if err != nil {
		return fmt.Errorf("revoke secret %s from key %s: %w", name, id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("revoke secret %s from key %s: %w", name, id, err)
	} else if n == 0 {
		return fmt.Errorf("key %s was not granted secret %q: %w", id, name, ErrNotFound)
	}
	return nil
}

// keySecrets returns the secrets granted to the key id, sorted.
func (s *Store) keySecrets(id string) ([]string, error) {
	rows, err := s.r.Query(`SELECT secret FROM key_secrets WHERE key_id = ? ORDER BY secret`, id)
	if err != nil {
		return nil, fmt.Errorf("secrets of key %s: %w", id, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("secrets of key %s: %w", id, err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// withSecrets fills k.Secrets.
func (s *Store) withSecrets(k Key, err error) (Key, error) {
	if err != nil {
		return k, err
	}
	k.Secrets, err = s.keySecrets(k.ID)
	return k, err
}
