// Package servicetest holds in-memory fakes of the service's dependencies
// (Backend, Session, Process and Auditor) for the tests of the service and
// of the front doors built on it.
//
// It is for tests only: no production package may import it (the fakes
// run no sandbox and check no key), which TestNoProductionImport checks.
//
// A program named "fake" runs its arguments as steps:
//
//	out:TEXT  write TEXT and a newline to stdout
//	err:TEXT  the same to stderr
//	raw:HEX   write the bytes HEX to stdout
//	env:NAME  write the command's variable NAME (else the manifest's) and a newline
//	cat       copy stdin to stdout until end-of-file
//	block     wait until signalled (or killed)
//	sleep:D   wait for the duration D
//	exit:N    exit with status N
//	cpu:MS    report MS milliseconds of CPU
//	deny:HOST record a refused network attempt
//	violate:K record a violation of kind K
//	kill-init end as infra-error and take the session's init with it
//
// Any other program echoes its argv, space-separated, to stdout. One-shot
// programs named fail-usage, fail-field, fail-internal, fail-unavailable
// and panic make Run fail that way; a command named fail-start is refused
// by Session.Start, and Stat of the path "panic" panics.
package servicetest
