package redteam

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// echClientHello returns the first TLS record crypto/tls sends with
// Encrypted Client Hello for an ECH config whose public (outer) name is
// publicName, the inner, encrypted name being innerName. python3's ssl
// module cannot send ECH, so the attack program sends these bytes as they
// are. The config is for a fresh X25519 key nobody serves: the handshake
// could never complete, but the proxy must refuse it before a byte reaches
// the destination anyway.
func echClientHello(publicName, innerName string) ([]byte, error) {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	u16 := func(b []byte, v int) []byte { return append(b, byte(v>>8), byte(v)) }
	pub := key.PublicKey().Bytes()
	// ECHConfigContents (draft-ietf-tls-esni-18 section 4): key config,
	// maximum_name_length, public_name, no extensions.
	var c []byte
	c = append(c, 1)     // config_id
	c = u16(c, 0x0020)   // DHKEM(X25519, HKDF-SHA256)
	c = u16(c, len(pub)) // public_key
	c = append(c, pub...)
	c = u16(c, 4)      // one cipher suite:
	c = u16(c, 0x0001) // HKDF-SHA256,
	c = u16(c, 0x0001) // AES-128-GCM
	c = append(c, 0, byte(len(publicName)))
	c = append(c, publicName...)
	c = u16(c, 0)
	cfg := append(u16(u16(nil, 0xfe0d), len(c)), c...)
	list := append(u16(nil, len(cfg)), cfg...)

	c1, c2 := net.Pipe()
	defer c2.Close()
	go func() {
		tc := tls.Client(c1, &tls.Config{ServerName: innerName, MinVersion: tls.VersionTLS13,
			EncryptedClientHelloConfigList: list, InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		tc.Handshake() // fails once c2 closes
		c1.Close()
	}()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	var hdr [5]byte
	if _, err := io.ReadFull(c2, hdr[:]); err != nil {
		return nil, fmt.Errorf("reading crypto/tls's ECH ClientHello: %w", err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(c2, body); err != nil {
		return nil, fmt.Errorf("reading crypto/tls's ECH ClientHello: %w", err)
	}
	return append(hdr[:], body...), nil
}

// echOuterName is the public name the ECH config is made with: crypto/tls
// wants at least two labels there, and the granted name is the single
// label localhost, so the outer SNI is written over afterwards with a name
// of the same length (no length field changes; the proxy never sees the
// encrypted inner hello, which this does not touch).
const echOuterName = "echf.test"

// echHelloFor returns echClientHello's bytes with the outer SNI
// outerName, which must be as long as echOuterName.
func echHelloFor(outerName, innerName string) ([]byte, error) {
	if len(outerName) != len(echOuterName) {
		return nil, fmt.Errorf("outer name %q must be %d bytes long", outerName, len(echOuterName))
	}
	hello, err := echClientHello(echOuterName, innerName)
	if err != nil {
		return nil, err
	}
	if n := bytes.Count(hello, []byte(echOuterName)); n != 1 {
		return nil, fmt.Errorf("crypto/tls's ECH ClientHello names %q %d times, want once (the outer SNI)", echOuterName, n)
	}
	return bytes.Replace(hello, []byte(echOuterName), []byte(outerName), 1), nil
}

// egressECH: CONNECT to a granted localhost:443 and send a real Encrypted
// Client Hello whose outer SNI is the granted name (localhost) and whose
// encrypted inner SNI is evil.example; then, as the control, a plain
// ClientHello with SNI localhost that must arrive.
func egressECH(ctx context.Context, r *runner) (string, string, int) {
	hello, err := echHelloFor("localhost", "evil.example")
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	tls443, err := egressListen("127.0.0.1:443", false)
	if err != nil {
		return Error, "host setup: port 443 on the host's loopback is busy (the SNI and ECH checks apply to port 443 only): " + err.Error(), 0
	}
	prog := `
ech = bytes.fromhex(sys.argv[1])
for i in range(2):
    s, st = connect("localhost:443", close=False)
    if st.split(" ")[1:2] == ["200"]:
        s.settimeout(2)
        try:
            s.sendall(ech); d = s.recv(100); print("ECH hello answered with", len(d), "bytes")
        except OSError as e:
            print("ECH hello ended", type(e).__name__)
    s.close()
s, st = connect("localhost:443", close=False)
if st.split(" ")[1:2] == ["200"]:
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    s.settimeout(2)
    try:
        ctx.wrap_socket(s, server_hostname="localhost"); print("control handshake completed")
    except (OSError, ssl.SSLError) as e:
        print("control handshake ended", type(e).__name__)
s.close()
`
	res, _, err := r.egressRun(ctx, []string{"localhost:443"}, []string{"127.0.0.1"}, nil, egressProg(prog, hex.EncodeToString(hello)))
	heads := tls443.close()
	if err != nil {
		return runErr(err)
	}
	// The ECH hello is sent as fixed bytes: a destination head that starts
	// with them is the hello let through.
	sig := string(hello[:min(len(hello), 64)])
	control := false
	for _, h := range heads {
		switch {
		case strings.HasPrefix(h, sig) || strings.Contains(h, "evil.example"):
			return Escaped, fmt.Sprintf("the destination behind localhost:443 received the Encrypted Client Hello (%d bytes first sent): its inner name could have been any site behind the front", len(h)), 1
		case strings.Contains(h, "localhost"):
			control = true
		case h != "":
			return Escaped, fmt.Sprintf("the destination behind localhost:443 received %d bytes from a tunnel that should have been cut: %q", len(h), clip(h, 60)), 1
		}
	}
	refused := 0
	for _, a := range res.Network {
		if a.Port == 443 && a.Reason == "ech-refused" && !a.Allowed {
			refused++
		}
	}
	if !control || refused < 2 {
		return Error, fmt.Sprintf("control ClientHello (SNI localhost) arrived=%v, ech-refused refusals=%d of 2 (%s; %s)", control, refused, egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("%d Encrypted Client Hellos (outer SNI localhost, inner evil.example, %d bytes) cut with ech-refused, no byte forwarded; the plain SNI localhost control arrived", refused, len(hello)), 1
}
