package redteam

// The red-team runner's secret source (issue 20 §4): the secret cases need
// a real value on the host side that the sandbox must never see. It lives
// in this process's memory only, one random value per case attempt under a
// random name, and is forgotten when the case ends; it is never printed,
// never written to a file, never put in a verdict.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// secretValuePrefix begins every real value the store makes. It is public
// (like a vendor's "sk_live_" prefix): the program inside may search for
// it, and anything it finds after it is what the host judges. The random
// part after it is the secret.
const secretValuePrefix = "moat-rt-real-"

// SecretStore is the red-team runner's secret source (engine.SecretSource)
// and the certificate of its local test API. Give the same store to
// engine.Options (Secrets, UpstreamRootCAs) and to Options.Secrets; a
// runner without one judges the secret cases not-applicable.
type SecretStore struct {
	mu     sync.Mutex
	values map[string]string
	roots  *x509.CertPool
	cert   tls.Certificate
}

// NewSecretStore makes an empty store and a fresh self-signed certificate
// for the test API (localhost and 127.0.0.1), valid for a day.
func NewSecretStore() (*SecretStore, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("red-team test API key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		return nil, fmt.Errorf("red-team test API certificate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "moat red-team test API"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// Its own root: the proxy verifies the upstream against it.
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("red-team test API certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("red-team test API certificate: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return &SecretStore{
		values: map[string]string{},
		roots:  roots,
		cert:   tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
	}, nil
}

// Value gives the real value of a secret bound by a running case. Its
// errors never hold a value.
func (s *SecretStore) Value(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[name]
	if !ok {
		return "", fmt.Errorf("no red-team secret named %q (only the secret cases' own, while they run)", name)
	}
	return v, nil
}

// RootCAs is the pool that verifies the test API's certificate: the
// engine's UpstreamRootCAs.
func (s *SecretStore) RootCAs() *x509.CertPool { return s.roots }

// bind makes a fresh secret for one case attempt: a random name and a
// random real value. forget removes it.
func (s *SecretStore) bind() (name, value string) {
	var n [6]byte
	var v [16]byte
	rand.Read(n[:])
	rand.Read(v[:])
	name, value = "rt-"+hex.EncodeToString(n[:]), secretValuePrefix+hex.EncodeToString(v[:])
	s.mu.Lock()
	s.values[name] = value
	s.mu.Unlock()
	return name, value
}

func (s *SecretStore) forget(name string) {
	s.mu.Lock()
	delete(s.values, name)
	s.mu.Unlock()
}
