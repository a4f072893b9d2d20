// Package audit is Moat's audit log: an embedded SQLite database (pure Go,
// modernc.org/sqlite) holding the API keys, one record per run, sandbox
// and exec, and what they tried (network attempts, limits hit). On top of
// the records it builds reports (what runs attempted and what they cost)
// and suggests the tightest manifest that would have allowed what the
// runs legitimately did.
//
// What it must never do:
//   - store or log an API key's secret: only its SHA-256 is kept, and a
//     token is compared in constant time;
//   - say why a key was refused: Authenticate answers ErrBadKey for every
//     malformed, unknown or revoked key alike;
//   - trust what a sandbox reported: host names, commands and error texts
//     are data, bounded when stored and escaped when rendered for a
//     terminal or written into a YAML comment;
//   - lose or duplicate a record: a record's id is its primary key, Begin
//     and Finish are single transactions, and one writer connection
//     serialises every write of the process.
package audit
