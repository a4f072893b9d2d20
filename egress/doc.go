// Package egress is Moat's egress proxy: the sandbox's only way out of its
// loopback-only network namespace.
//
// The proxy runs on the host inside moat's process and is reached from the
// sandbox through a Unix socket. It forwards plain HTTP requests given in
// absolute form (GET http://host/path) and CONNECT tunnels, and nothing else.
// Every destination attempt is logged once (Attempts), with the bytes that
// flowed each way.
//
// What it must never do:
//   - decide on an address the client supplies: the decision is made on the
//     host name the client asked for, matched against the allowlist (Rule);
//     IP literals are refused unless explicitly granted (Policy.AllowAddresses);
//   - let the sandbox resolve names: the proxy resolves them itself, refuses the
//     request if any answer is loopback, private, link-local (the cloud
//     metadata service), CGNAT, multicast or otherwise reserved, and dials
//     exactly the address it checked, so a second, different DNS answer
//     (rebinding) is never used;
//   - let a TLS tunnel on port 443 carry a different name than the one allowed
//     (the ClientHello's SNI must equal the CONNECT host: no domain fronting
//     through an allowed front);
//   - grow without bound: concurrent connections, connection rate, bytes each
//     way per run, idle and handshake time are all limited (Limits), and a
//     flood of connections costs at most a bounded number of goroutines;
//   - fail open: an internal error, a panic or a closed proxy refuses.
package egress
