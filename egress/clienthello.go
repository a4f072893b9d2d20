package egress

import (
	"errors"
	"io"
)

// The ClientHello parser reads bytes the sandbox wrote: every length is
// checked against what is left before it is used, the total read is bounded,
// and anything unexpected is an error, never a guess.

const (
	recordTypeHandshake   = 22
	handshakeClientHello  = 1
	maxRecordPlaintext    = 1 << 14 // RFC 8446 5.1
	maxClientHelloBytes   = 1 << 16 // larger than any real ClientHello, incl. post-quantum key shares
	extServerName         = 0
	serverNameTypeHost    = 0
	maxSNILength          = 253
	maxClientHelloRecords = 8

	// Encrypted Client Hello (draft-ietf-tls-esni): the outer hello
	// carries a public SNI, the encrypted inner one the real name. A
	// proxy that checks only the outer name lets the sandbox reach any
	// site behind the same CDN front, so a hello with any of these is
	// refused.
	extECH           = 0xfe0d // encrypted_client_hello, draft 13 and later (the RFC's code point)
	extECHDraftFirst = 0xfe08 // drafts 8 to 12 numbered the extension 0xfe08..0xfe0c
	extECHDraftLast  = 0xfe0c
	extECHOuterExts  = 0xfd00 // ech_outer_extensions: belongs only inside an inner hello
	extESNI          = 0xffce // encrypted_server_name, the ESNI drafts ECH replaced
)

var (
	errNotTLS      = errors.New("egress: not a TLS ClientHello")
	errNoSNI       = errors.New("egress: ClientHello without server_name")
	errBadHello    = errors.New("egress: malformed ClientHello")
	errHelloTooBig = errors.New("egress: ClientHello too large")
	// errECH is a ClientHello that encrypts its real server name: the
	// SNI the proxy can read is not the one the server routes on.
	errECH = errors.New("egress: ClientHello with Encrypted Client Hello")
)

// isECHExtension reports whether an extension type carries or belongs to
// an encrypted ClientHello, in the final code point or a draft one that
// deployed clients sent.
func isECHExtension(typ int) bool {
	return typ == extECH || typ == extESNI || typ == extECHOuterExts ||
		(typ >= extECHDraftFirst && typ <= extECHDraftLast)
}

// readClientHello reads TLS records from r until it holds one complete
// ClientHello, and returns the raw bytes read (to replay upstream) and the
// SNI host name. It reads exactly the records' bytes, nothing past them.
func readClientHello(r io.Reader) (raw []byte, sni string, err error) {
	var hs []byte // the handshake message, reassembled across records
	for range maxClientHelloRecords {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return raw, "", errNotTLS
		}
		raw = append(raw, hdr[:]...)
		// A ClientHello record: handshake type, legacy version 3.x.
		if hdr[0] != recordTypeHandshake || hdr[1] != 3 {
			return raw, "", errNotTLS
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > maxRecordPlaintext {
			return raw, "", errBadHello
		}
		if len(hs)+n > maxClientHelloBytes+4 {
			return raw, "", errHelloTooBig
		}
		start := len(raw)
		raw = append(raw, make([]byte, n)...)
		if _, err := io.ReadFull(r, raw[start:]); err != nil {
			return raw[:start], "", errBadHello
		}
		hs = append(hs, raw[start:]...)
		if len(hs) < 4 {
			continue
		}
		if hs[0] != handshakeClientHello {
			return raw, "", errNotTLS
		}
		msgLen := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
		if msgLen > maxClientHelloBytes {
			return raw, "", errHelloTooBig
		}
		if len(hs) < 4+msgLen {
			continue
		}
		// Nothing may follow the ClientHello in the first flight: bytes
		// the proxy did not inspect would reach the server as handshake.
		if len(hs) != 4+msgLen {
			return raw, "", errBadHello
		}
		sni, err := parseClientHello(hs[4:])
		return raw, sni, err
	}
	return raw, "", errHelloTooBig
}

// cursor is a bounds-checked reader over a byte slice; after the first
// failure every read fails.
type cursor struct {
	b  []byte
	ok bool
}

func (c *cursor) bytes(n int) []byte {
	if !c.ok || n < 0 || n > len(c.b) {
		c.ok = false
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

func (c *cursor) u8() int {
	v := c.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (c *cursor) u16() int {
	v := c.bytes(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

// vec reads a vector with an n-byte length prefix (n is 1 or 2).
func (c *cursor) vec(n int) cursor {
	var l int
	if n == 1 {
		l = c.u8()
	} else {
		l = c.u16()
	}
	b := c.bytes(l)
	return cursor{b: b, ok: c.ok}
}

// parseClientHello parses a ClientHello body (after the 4-byte handshake
// header) and returns its one server_name host name (RFC 6066 section 3).
func parseClientHello(body []byte) (string, error) {
	c := cursor{b: body, ok: true}
	if c.u8() != 3 { // legacy_version major
		return "", errBadHello
	}
	c.u8()
	c.bytes(32) // random
	if sid := c.vec(1); len(sid.b) > 32 {
		return "", errBadHello
	}
	if cs := c.vec(2); len(cs.b) < 2 || len(cs.b)%2 != 0 {
		return "", errBadHello
	}
	if cm := c.vec(1); len(cm.b) < 1 {
		return "", errBadHello
	}
	if !c.ok {
		return "", errBadHello
	}
	if len(c.b) == 0 {
		return "", errNoSNI // no extensions at all (SSL 3.0 style)
	}
	exts := c.vec(2)
	if !c.ok || len(c.b) != 0 {
		return "", errBadHello
	}
	seen := map[int]bool{}
	sni := ""
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.vec(2)
		if !exts.ok {
			return "", errBadHello
		}
		// RFC 8446 4.2: at most one extension of each type. Two
		// server_name extensions would let the proxy and the server
		// read different names.
		if seen[typ] {
			return "", errBadHello
		}
		seen[typ] = true
		if isECHExtension(typ) {
			// Refused whatever the outer name: checked before the
			// SNI is even looked at, so no outer name can make an
			// encrypted inner one pass.
			return "", errECH
		}
		if typ != extServerName {
			continue
		}
		name, err := parseServerName(data)
		if err != nil {
			return "", err
		}
		sni = name
	}
	if sni == "" {
		return "", errNoSNI
	}
	return sni, nil
}

// parseServerName parses a server_name extension body: exactly one entry,
// of type host_name, a plain ASCII name.
func parseServerName(data cursor) (string, error) {
	list := data.vec(2)
	if !data.ok || len(data.b) != 0 {
		return "", errBadHello
	}
	typ := list.u8()
	name := list.vec(2)
	if !list.ok || len(list.b) != 0 || typ != serverNameTypeHost {
		return "", errBadHello
	}
	if len(name.b) == 0 || len(name.b) > maxSNILength {
		return "", errBadHello
	}
	for _, ch := range name.b {
		if ch <= 0x20 || ch >= 0x7f {
			return "", errBadHello
		}
	}
	return string(name.b), nil
}
