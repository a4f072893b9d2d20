package main

// moat serve --metrics-listen: /metrics on a listener of its own, without
// a key, so that a Prometheus on the host scrapes it without holding an
// admin key (which could also run sandboxes, read every tenant's
// incidents and approve their commands).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// checkMetricsAddr refuses a --metrics-listen address that is not
// loopback unless public allows it: the series are every tenant's, and the
// listener asks for no key. where names the setting's source.
func checkMetricsAddr(addr string, public bool, where func(string) string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT such as 127.0.0.1:9464: %v", where("metrics-listen"), addr, err)
	}
	if public || isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("%s %q is not a loopback address: the metrics listener asks for no key and shows every tenant's activity; use 127.0.0.1:PORT (or [::1]:PORT), or add --metrics-public to serve it on %s", where("metrics-listen"), addr, host)
}

// isLoopbackHost: an IP address on loopback, or "localhost". An empty
// host (":9464") is every address, so not loopback.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveMetrics listens on addr and serves h there until the returned stop
// is called.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: listen on %s: %w", addr, err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	}()
	log.Info("metrics listening", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		hs.Shutdown(ctx)
	}, nil
}
