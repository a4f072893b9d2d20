package main

// How moat writes to its user: its own messages through output.Sanitize,
// the program's output sanitised when it goes to a terminal, JSON on stdout.

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/output"
)

// printJSON writes v to stdout as indented JSON (output.EncodeJSON).
func printJSON(v any) int {
	if err := output.EncodeJSON(os.Stdout, v, "  "); err != nil {
		return fail(err)
	}
	return 0
}

// say writes a message of moat's to stderr through output.Sanitize: the
// parts of it that came from a sandbox or a server (a reason, an error,
// a result from --server) reach the terminal inert; newlines stay.
func say(format string, args ...any) {
	os.Stderr.Write(output.Sanitize([]byte(fmt.Sprintf(format, args...))))
}

type flusher interface{ Flush() error }

// liveWriter streams untrusted output to the user. On a terminal, control
// sequences are neutralised (output.Sanitize: C0 controls but newline, tab
// and CRLF, DEL, C1, bidi formatting characters, bytes that are not UTF-8)
// so the program cannot rewrite the screen or a line (a bare CR), set the
// clipboard (OSC 52) or retitle the window; pipes get the bytes as is.
func liveWriter(f *os.File) interface {
	io.Writer
	flusher
} {
	if isTerminal(f) {
		return output.NewSanitizingWriter(f)
	}
	return plain{f}
}

type plain struct{ io.Writer }

func (plain) Flush() error { return nil }

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressWriter is where long operations (image builds) report progress.
func progressWriter() io.Writer { return os.Stderr }
