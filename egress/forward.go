package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 section 7.6.1 plus the
// proxy credentials: none of them is meant for the destination, and
// Proxy-Authorization would hand it whatever the sandbox put there.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func stripHopByHop(h http.Header) {
	for _, name := range []string{"Connection", "Proxy-Connection"} {
		for _, v := range h[name] {
			for _, f := range strings.Split(v, ",") {
				if f = textproto.TrimString(f); f != "" {
					h.Del(f)
				}
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// forwardMethods are the methods forwarded as plain HTTP. TRACE (it reflects
// headers back), CONNECT-like extensions and anything unknown are refused.
var forwardMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// forward relays one absolute-URI HTTP request. The connection to the
// destination is used for this request only (Connection: close both ways),
// so each request is one attempt with its own decision and byte counts, and
// nothing can be smuggled behind it. Redirects are passed back to the client,
// never followed: the next hop is the client's next request, decided afresh.
func (s *session) forward(req *http.Request) {
	if s.serveIndex(req) {
		return
	}
	if !forwardMethods[req.Method] {
		s.refuse(http.StatusMethodNotAllowed, ReasonBadRequest, fmt.Sprintf("method %q is not forwarded; plain HTTP takes GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, and tunnels take CONNECT", req.Method))
		return
	}
	u := req.URL
	if u == nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, "this is a proxy: send absolute URIs (GET http://host/path) or CONNECT host:port")
		return
	}
	if !strings.EqualFold(u.Scheme, "http") {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, fmt.Sprintf("scheme %q is not forwarded; http:// is, https:// goes through CONNECT", u.Scheme))
		return
	}
	if u.User != nil {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, "user info in the request URI is refused; send credentials in a header")
		return
	}
	if req.ProtoMajor != 1 {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, "only HTTP/1.x is proxied")
		return
	}
	rawHost, port, err := targetPort(u.Host, 80)
	if err != nil {
		s.refuse(http.StatusBadRequest, ReasonBadRequest, fmt.Sprintf("bad host in request URI: %v", err))
		return
	}
	if s.p.sec.inName(rawHost) {
		s.refuseExfiltration(rawHost, port)
		return
	}
	// Placeholders are checked (and put in for a bound host) before
	// anything is dialed: a refused request never reaches its host.
	var bound []*secretBinding
	var sub substitution
	var bodyRep *streamReplacer
	if s.p.sec != nil {
		if h, err := normaliseHost(rawHost); err == nil {
			bound = s.p.sec.bound(h, port)
		}
		if sub, err = s.p.sec.rewriteRequest(req, bound); err != nil {
			s.refuseExfiltration(rawHost, port)
			return
		}
	}
	if !s.admitDestination(rawHost, port, false) {
		return
	}

	// The destination sees the name the decision was made on, in its
	// normalised form, and the origin-form path; nothing about the sandbox.
	host := s.att.Host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != 80 {
		host = net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(port))
	}
	out := req
	out.Host = host
	out.URL.Host = host
	out.URL.Scheme = "http"
	stripHopByHop(out.Header)
	expect := false
	for _, v := range out.Header.Values("Expect") {
		expect = expect || strings.EqualFold(textproto.TrimString(v), "100-continue")
	}
	out.Header.Del("Expect")
	if _, ok := out.Header["User-Agent"]; !ok {
		// An empty value keeps net/http from adding its own User-Agent.
		out.Header["User-Agent"] = []string{""}
	}
	out.Close = true
	if len(bound) > 0 {
		// A compressed answer could not be scrubbed of the value.
		out.Header.Del("Accept-Encoding")
	}
	idle := s.p.pol.limits.IdleTimeout
	s.client.Conn.SetDeadline(time.Time{})
	s.client.setIdle(idle)
	s.up.setIdle(idle)
	if expect {
		// The client waits for this before sending its body; the
		// destination never saw the Expect header.
		if _, err := io.WriteString(s.client, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return
		}
	}

	if s.p.sec != nil {
		cb, err := s.p.sec.prepareBody(out.Body, out.ContentLength, sub.body)
		if cb.refused {
			s.refuse(http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder was sent in a request body its binding does not allow; refused")
			return
		}
		if err != nil {
			s.refuse(http.StatusBadRequest, ReasonBadRequest, "could not read the request body")
			return
		}
		cb.apply(out)
		bodyRep = cb.rep
	}

	// The request goes up while the response comes down: a destination
	// may answer (413, 401) before it has read the whole body.
	sent := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				sent <- fmt.Errorf("panic: %v", r)
			}
		}()
		bw := bufio.NewWriterSize(s.up, 32<<10)
		err := out.Write(bw)
		if err == nil {
			err = bw.Flush()
		}
		if s.up.overBudget.Load() || bodyRep.refused() {
			// The destination would wait for the rest of the body
			// until the idle timeout; end it now.
			s.up.Conn.Close()
		}
		sent <- err
	}()
	defer func() {
		// Unblock the writer (it may be waiting on either side) before
		// waiting for it.
		s.up.Conn.Close()
		s.client.Conn.Close()
		<-sent
	}()

	hdr := &capReader{r: s.up, n: maxRespHeaderBytes, err: errHeaderTooLarge}
	ubr := bufio.NewReaderSize(hdr, 32<<10)
	resp, err := readResponse(ubr, out.Method)
	if err != nil {
		if s.up.overBudget.Load() {
			s.refuse(http.StatusServiceUnavailable, ReasonLimitBytes, "the run's network byte budget is spent")
			return
		}
		// The writer closes the upstream when the body carried a
		// placeholder; its result is put back for the deferred wait.
		werr := <-sent
		sent <- werr
		if bodyRep.refused() {
			s.refuse(http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder was sent in a request body its binding does not allow; refused")
			return
		}
		s.refuse(http.StatusBadGateway, ReasonUpstreamError, fmt.Sprintf("no valid response from %s", s.att.Host))
		return
	}
	hdr.n = -1
	stripHopByHop(resp.Header)
	resp.Close = true
	if bodyRep != nil {
		// Only with secrets: the body's verdict and replacements are
		// known once it went out; a body refused half-way closed the
		// destination, which rarely answers first.
		werr := <-sent
		sent <- werr
	}
	if bodyRep.refused() {
		s.refuse(http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder was sent in a request body its binding does not allow; refused")
		return
	}
	s.p.countSecretUse(append(sub.used, bodyRep.replacedIn(sub.body)...), s.att.Host)
	if len(bound) > 0 {
		scrub := append(scrubPatterns(bound), sub.scrub...)
		scrubHeader(resp.Header, scrub)
		// Trailers come after the body, unscrubbed: dropped.
		resp.Trailer = nil
		if bodyAllowed(resp.StatusCode, out.Method) {
			resp.Body = newStreamReplacer(resp.Body, scrub)
			resp.ContentLength = -1
			resp.Header.Del("Content-Length")
		}
	}
	cw := bufio.NewWriterSize(s.client, 32<<10)
	if err := resp.Write(cw); err == nil {
		cw.Flush()
	}
}

// readResponse reads the final response, skipping interim 1xx responses
// (bounded). 101 is refused: Upgrade was stripped, so a switch of protocols
// is not something this proxy agreed to carry.
func readResponse(br *bufio.Reader, method string) (*http.Response, error) {
	for range 8 {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, fmt.Errorf("unexpected 101 Switching Protocols")
		case resp.StatusCode >= 100 && resp.StatusCode < 200:
			continue
		}
		return resp, nil
	}
	return nil, fmt.Errorf("too many interim responses")
}
