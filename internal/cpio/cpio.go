// Package cpio writes the "newc" cpio archives the Linux kernel unpacks as
// an initramfs: the microvm tier's guest, and tests that boot a kernel.
package cpio

import (
	"fmt"
	"io"
)

// Writer writes entries in order; every entry has owner 0:0, one link and
// a fresh inode number. The first error sticks and is returned by Close.
type Writer struct {
	w   io.Writer
	ino int
	err error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Dir adds a directory, mode 0755.
func (c *Writer) Dir(name string) { c.entry(name, 0o040755, nil) }

// File adds a regular file with the permission bits perm.
func (c *Writer) File(name string, perm uint32, data []byte) {
	c.entry(name, 0o100000|perm&0o7777, data)
}

// Symlink adds a symbolic link name -> target.
func (c *Writer) Symlink(name, target string) { c.entry(name, 0o120777, []byte(target)) }

// Close writes the trailer and returns the first error.
func (c *Writer) Close() error {
	c.entry("TRAILER!!!", 0, nil)
	return c.err
}

// entry writes one header (13 hexadecimal fields), the NUL-terminated name
// and the data, each padded to four bytes.
func (c *Writer) entry(name string, mode uint32, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	b := make([]byte, 0, len(hdr)+len(name)+len(data)+8)
	b = append(b, hdr...)
	b = append(b, name...)
	b = append(b, 0)
	b = pad4(b)
	b = append(b, data...)
	b = pad4(b)
	_, c.err = c.w.Write(b)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
