package cpio

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
)

type entry struct {
	name string
	mode uint32
	data string
}

// parse reads back a newc archive: what the kernel's unpacker would see.
func parse(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	for off := 0; ; {
		if off%4 != 0 || len(b) < off+110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at offset %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("header field %d at %d: %v", i, off, err)
			}
			return int(v)
		}
		mode, size, namesize := uint32(field(1)), field(6), field(11)
		name := b[off+110 : off+110+namesize]
		if name[len(name)-1] != 0 {
			t.Fatalf("name at %d not NUL-terminated", off)
		}
		data := off + 110 + namesize
		data += (4 - data%4) % 4
		e := entry{string(name[:len(name)-1]), mode, string(b[data : data+size])}
		if e.name == "TRAILER!!!" {
			if end := data + size; end != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-end)
			}
			return out
		}
		out = append(out, e)
		off = data + size
		off += (4 - off%4) % 4
	}
}

func TestWriter(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	w.Dir("bin")
	w.File("bin/busybox", 0o755, []byte("12345"))
	w.Symlink("bin/sh", "busybox")
	w.File("init", 0o4755|0o170000, []byte("x")) // type bits are ignored
	w.File("empty", 0o644, nil)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{"bin", 0o040755, ""},
		{"bin/busybox", 0o100755, "12345"},
		{"bin/sh", 0o120777, "busybox"},
		{"init", 0o104755, "x"},
		{"empty", 0o100644, ""},
	}
	got := parse(t, b.Bytes())
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

type failing struct{ n int }

func (f *failing) Write(p []byte) (int, error) {
	if f.n--; f.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriterKeepsFirstError(t *testing.T) {
	f := &failing{n: 1}
	w := NewWriter(f)
	w.Dir("a")
	w.Dir("b")
	w.Dir("c")
	if err := w.Close(); err == nil || err.Error() != "disk full" {
		t.Fatalf("Close = %v, want disk full", err)
	}
	if f.n != -1 {
		t.Errorf("wrote on after the first error (%d more writes)", -1-f.n)
	}
}
