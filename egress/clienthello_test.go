package egress

import (
	"bufio"
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// captureHello returns the first flight crypto/tls sends for cfg: real
// ClientHellos, the parser's main input and the fuzzers' seeds.
func captureHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	defer c2.Close()
	go func() {
		tc := tls.Client(c1, cfg)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		tc.Handshake() // fails once c2 closes
		c1.Close()
	}()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	raw, _, err := readClientHello(c2)
	if err != nil && !errors.Is(err, errNoSNI) && !errors.Is(err, errECH) {
		t.Fatalf("reading crypto/tls's ClientHello: %v", err)
	}
	return raw
}

// echConfigList returns an ECHConfigList (draft-ietf-tls-esni-18 section
// 4) with one config for a fresh X25519 key and the given public name, so
// that crypto/tls sends a real Encrypted Client Hello.
func echConfigList(t testing.TB, publicName string) []byte {
	t.Helper()
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u16 := func(b []byte, v int) []byte { return append(b, byte(v>>8), byte(v)) }
	pub := key.PublicKey().Bytes()
	var c []byte
	c = append(c, 1)      // config_id
	c = u16(c, 0x0020)    // DHKEM(X25519, HKDF-SHA256)
	c = u16(c, len(pub))  // public_key
	c = append(c, pub...) //
	c = u16(c, 4)         // cipher_suites: one
	c = u16(c, 0x0001)    // HKDF-SHA256
	c = u16(c, 0x0001)    // AES-128-GCM
	c = append(c, 0)      // maximum_name_length
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = u16(c, 0) // no extensions
	cfg := u16(u16(nil, 0xfe0d), len(c))
	cfg = append(cfg, c...)
	return append(u16(nil, len(cfg)), cfg...)
}

// echHello is crypto/tls's first flight with Encrypted Client Hello: the
// outer SNI is publicName, the encrypted inner one innerName.
func echHello(t testing.TB, publicName, innerName string) []byte {
	t.Helper()
	return captureHello(t, &tls.Config{
		ServerName:                     innerName,
		MinVersion:                     tls.VersionTLS13,
		EncryptedClientHelloConfigList: echConfigList(t, publicName),
		InsecureSkipVerify:             true,
	})
}

// synthHello builds a ClientHello record with the given extensions block
// contents (each already type+length encoded).
func synthHello(exts ...[]byte) []byte {
	var body []byte
	body = append(body, 3, 3)                // legacy_version
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session id
	body = append(body, 0, 2, 0x13, 0x01)    // one cipher suite
	body = append(body, 1, 0)                // null compression
	var all []byte
	for _, e := range exts {
		all = append(all, e...)
	}
	body = append(body, byte(len(all)>>8), byte(len(all)))
	body = append(body, all...)
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{22, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

func sniExt(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0, byte(len(n)>>8), byte(len(n)))
		list = append(list, n...)
	}
	data := append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
	return append([]byte{0, 0, byte(len(data) >> 8), byte(len(data))}, data...)
}

// refragment splits one ClientHello record into records of at most n bytes
// of handshake data, as a TLS stack may.
func refragment(rec []byte, n int) []byte {
	hs := rec[5:]
	var out []byte
	for len(hs) > 0 {
		k := min(n, len(hs))
		out = append(out, 22, 3, 1, byte(k>>8), byte(k))
		out = append(out, hs[:k]...)
		hs = hs[k:]
	}
	return out
}

func TestClientHello(t *testing.T) {
	real := captureHello(t, &tls.Config{ServerName: "files.pythonhosted.org", InsecureSkipVerify: true})
	tls12 := captureHello(t, &tls.Config{ServerName: "pypi.org", MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true})
	noSNI := captureHello(t, &tls.Config{InsecureSkipVerify: true})
	ech := echHello(t, "allowed.test", "other.test")
	echSame := echHello(t, "allowed.test", "allowed.test")
	ext := func(typ int, data ...byte) []byte {
		return append([]byte{byte(typ >> 8), byte(typ), byte(len(data) >> 8), byte(len(data))}, data...)
	}
	tests := []struct {
		name    string
		in      []byte
		wantSNI string
		wantErr error
	}{
		{"crypto/tls 1.3", real, "files.pythonhosted.org", nil},
		{"crypto/tls 1.2", tls12, "pypi.org", nil},
		{"crypto/tls no SNI", noSNI, "", errNoSNI},
		{"split across records", refragment(real, 1000), "files.pythonhosted.org", nil},
		{"split to one byte records", refragment(real, 1), "", errHelloTooBig},
		{"synthetic", synthHello(sniExt("allowed.test")), "allowed.test", nil},
		{"no extensions", synthHello(), "", errNoSNI},
		{"other extension only", synthHello([]byte{0, 10, 0, 0}), "", errNoSNI},
		{"two server_name extensions", synthHello(sniExt("allowed.test"), sniExt("evil.test")), "", errBadHello},
		{"two names in one extension", synthHello(sniExt("allowed.test", "evil.test")), "", errBadHello},
		{"empty name", synthHello(sniExt("")), "", errBadHello},
		{"name with NUL", synthHello(sniExt("allowed.test\x00.evil")), "", errBadHello},
		{"name with space", synthHello(sniExt("allowed test")), "", errBadHello},
		// Encrypted Client Hello: the readable SNI is the outer one;
		// the server may route on the encrypted inner one.
		{"crypto/tls ECH, other inner name", ech, "", errECH},
		{"crypto/tls ECH, same inner name", echSame, "", errECH},
		{"crypto/tls ECH split across records", refragment(ech, 300), "", errECH},
		{"ECH before server_name", synthHello(ext(0xfe0d, 0, 1, 2), sniExt("allowed.test")), "", errECH},
		{"ECH after server_name", synthHello(sniExt("allowed.test"), ext(0xfe0d, 0, 1, 2)), "", errECH},
		{"empty ECH extension", synthHello(sniExt("allowed.test"), ext(0xfe0d)), "", errECH},
		{"ECH without server_name", synthHello(ext(0xfe0d, 1)), "", errECH},
		{"ESNI draft 0xffce", synthHello(sniExt("allowed.test"), ext(0xffce, 0, 1)), "", errECH},
		{"ECH draft 0xfe08", synthHello(sniExt("allowed.test"), ext(0xfe08, 0)), "", errECH},
		{"ECH draft 0xfe0c", synthHello(sniExt("allowed.test"), ext(0xfe0c, 0)), "", errECH},
		{"ech_outer_extensions in an outer hello", synthHello(sniExt("allowed.test"), ext(0xfd00, 2, 0, 10)), "", errECH},
		{"neighbour code point 0xfe0e is not ECH", synthHello(sniExt("allowed.test"), ext(0xfe0e, 0)), "allowed.test", nil},
		{"neighbour code point 0xfe07 is not ECH", synthHello(sniExt("allowed.test"), ext(0xfe07, 0)), "allowed.test", nil},
		{"http", []byte("GET / HTTP/1.1\r\n\r\n"), "", errNotTLS},
		{"alert record", []byte{21, 3, 1, 0, 2, 2, 40}, "", errNotTLS},
		{"ssl2 style", []byte{0x80, 0x2e, 1, 0, 2}, "", errNotTLS},
		{"empty record", []byte{22, 3, 1, 0, 0}, "", errBadHello},
		{"oversized record", []byte{22, 3, 1, 0x40, 0x01}, "", errBadHello},
		{"server hello", []byte{22, 3, 3, 0, 4, 2, 0, 0, 0}, "", errNotTLS},
		{"huge handshake length", []byte{22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff}, "", errHelloTooBig},
		{"empty input", nil, "", errNotTLS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw, sni, err := readClientHello(bytes.NewReader(tc.in))
			if !errors.Is(err, tc.wantErr) || sni != tc.wantSNI {
				t.Fatalf("readClientHello = %q, %v; want %q, %v", sni, err, tc.wantSNI, tc.wantErr)
			}
			if !bytes.Equal(raw, tc.in[:len(raw)]) {
				t.Fatal("raw bytes are not a prefix of the input")
			}
			if err == nil && len(raw) != len(tc.in) {
				t.Fatalf("read %d of %d bytes of a complete hello", len(raw), len(tc.in))
			}
		})
	}
	t.Run("every truncation fails cleanly", func(t *testing.T) {
		for n := range len(real) {
			if _, _, err := readClientHello(bytes.NewReader(real[:n])); err == nil {
				t.Fatalf("truncated hello (%d of %d bytes) accepted", n, len(real))
			}
		}
	})
	t.Run("reads nothing past the hello", func(t *testing.T) {
		br := bufio.NewReader(io.MultiReader(bytes.NewReader(real), bytes.NewReader([]byte("next"))))
		if _, _, err := readClientHello(br); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(br)
		if string(rest) != "next" {
			t.Fatalf("left %q", rest)
		}
	})
	t.Run("trailing handshake bytes in the record", func(t *testing.T) {
		rec := synthHello(sniExt("allowed.test"))
		rec = append(rec, 0xAA)
		rec[4]++
		if _, _, err := readClientHello(bytes.NewReader(rec)); !errors.Is(err, errBadHello) {
			t.Fatalf("err %v", err)
		}
	})
}
