// Package egress is Moat's egress proxy: the sandbox's only way out of its
// loopback-only network namespace.
//
// The proxy runs on the host inside moat's process and is reached from the
// sandbox through a Unix socket. It forwards plain HTTP requests given in
// absolute form (GET http://host/path) and CONNECT tunnels, and nothing else.
// Every destination attempt is accounted for once: every attempt let
// through is logged (Attempts) with the bytes that flowed each way, as are
// the first Limits.MaxLogEntries refused ones; refused attempts past that
// are counted by reason and destination (Summary), so a flood of refusals
// can neither exhaust memory nor push an allowed attempt out of the record.
//
// What it must never do:
//   - decide on an address the client supplies: the decision is made on the
//     host name the client asked for, matched against the allowlist (Rule);
//     IP literals are refused unless explicitly granted (Policy.AllowAddresses);
//   - resolve a name only a wildcard rule allows for free: each new such
//     name is a DNS query carrying bytes the program chose off the host, so
//     it costs its length of the out budget and is rate-limited
//     (Limits.NamesPerSecond);
//   - let the sandbox resolve names: the proxy resolves them itself, refuses the
//     request if any answer is loopback, private, link-local (the cloud
//     metadata service), CGNAT, multicast or otherwise reserved, and dials
//     exactly the address it checked, so a second, different DNS answer
//     (rebinding) is never used;
//   - let a TLS tunnel on port 443 name a different server than the one
//     allowed in its ClientHello (the SNI must equal the CONNECT host, and a
//     hello with Encrypted Client Hello, whose real name the proxy cannot
//     read, is refused). This is not a cure for domain fronting: inside an
//     opaque tunnel the HTTP Host header is encrypted, and a CDN that routes
//     on it can still be reached through any allowlisted name it serves;
//   - grow without bound: concurrent connections, connection rate, bytes each
//     way per run, idle and handshake time are all limited (Limits), and a
//     flood of connections costs at most a bounded number of goroutines;
//   - fail open: an internal error, a panic or a closed proxy refuses.
package egress
