package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// tlsPort is the port on which a tunnel must start with a TLS ClientHello
// whose SNI is the CONNECT host. Other ports are tunnelled as opaque bytes:
// many protocols there (SSH, SMTP, databases) have the server speak first,
// so waiting for the client to send a ClientHello would deadlock them.
const tlsPort = 443

// connect serves a CONNECT tunnel.
func (s *session) connect(req *http.Request) {
	if req.URL == nil || req.URL.User != nil || req.URL.Path != "" || req.URL.RawQuery != "" {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, "CONNECT takes host:port")
		return
	}
	rawHost, port, err := splitHostPort(req.Host)
	if err != nil {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, fmt.Sprintf("CONNECT takes host:port: %v", err))
		return
	}
	if s.p.sec.inName(rawHost) {
		// Before any lookup: resolving the name would carry the
		// placeholder off the host.
		s.refuseExfiltration(rawHost, port)
		return
	}
	if !s.admitDestination(rawHost, port, true) {
		return
	}
	bound := s.p.sec.bound(s.att.Host, port)
	if len(bound) > 0 && s.p.ca == nil {
		s.refuse(http.StatusServiceUnavailable, ReasonUpstreamError, "the run CA for secret-bound hosts could not be made")
		return
	}
	lim := s.p.pol.limits
	s.client.Conn.SetWriteDeadline(time.Now().Add(lim.HandshakeTimeout))
	if _, err := io.WriteString(s.client.Conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}

	if len(bound) > 0 {
		s.intercept(port, bound)
		return
	}
	var hello []byte
	if port == tlsPort && !isIPLiteral(s.att.Host) {
		// The name was decided on the CONNECT line; the TLS server will
		// route on the SNI. They must agree, or an allowed front could
		// carry any name behind it (domain fronting). A granted IP
		// literal has no name to compare, and the grant is the address.
		s.client.Conn.SetReadDeadline(time.Now().Add(lim.HandshakeTimeout))
		raw, sni, err := readClientHello(s.br)
		if errors.Is(err, errECH) {
			s.att.Allowed, s.att.Reason = false, ReasonECHRefused
			return
		}
		if err != nil || !sameHost(sni, s.att.Host) {
			s.att.Allowed, s.att.Reason = false, ReasonSNIMismatch
			return
		}
		hello = raw
	}
	s.client.Conn.SetDeadline(time.Time{})
	s.client.setIdle(lim.IdleTimeout)
	s.up.setIdle(lim.IdleTimeout)
	if len(hello) > 0 {
		// The peeked ClientHello is replayed: the destination sees the
		// client's bytes unchanged.
		if _, err := s.up.Write(hello); err != nil {
			return
		}
	}
	s.tunnel()
}

// sameHost compares an SNI with the normalised CONNECT host: case-insensitive,
// without a trailing dot, in punycode.
func sameHost(sni, host string) bool {
	n, err := normaliseHost(sni)
	return err == nil && n == host
}

func isIPLiteral(h string) bool {
	_, err := netip.ParseAddr(h)
	return err == nil
}

// tunnel copies both ways until both directions end. A clean end of one
// direction is passed on as a half-close; an error (budget, idle timeout,
// reset) tears down both.
func (s *session) tunnel() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { recover() }()
		_, err := io.Copy(s.client, s.up)
		s.endDirection(s.client.Conn, err)
	}()
	// s.br, not the raw connection: it holds whatever the client sent
	// right behind the CONNECT header.
	_, err := io.Copy(s.up, s.br)
	s.endDirection(s.up.Conn, err)
	<-done
}

func (s *session) endDirection(dst net.Conn, err error) {
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	s.client.Conn.Close()
	s.up.Conn.Close()
}
