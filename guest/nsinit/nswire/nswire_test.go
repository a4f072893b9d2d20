package nswire

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := Command{Argv: []string{"python3", "-c", "print(1)"}, Env: []string{"A=b"}, Dir: "/workspace"}
	if err := WriteFrame(&buf, &in); err != nil {
		t.Fatal(err)
	}
	var out Command
	if err := ReadFrame(&buf, &out); err != nil {
		t.Fatal(err)
	}
	if out.Dir != in.Dir || len(out.Argv) != 3 || out.Env[0] != "A=b" {
		t.Errorf("round trip = %+v, want %+v", out, in)
	}
}

func TestReadFrameRejectsOversize(t *testing.T) {
	hdr := binary.LittleEndian.AppendUint32(nil, MaxConfigBytes+1)
	var c Command
	if err := ReadFrame(bytes.NewReader(hdr), &c); err == nil {
		t.Error("an oversized frame was accepted")
	}
}

// FuzzReadFrame: init reads frames from the host; a corrupted frame must
// fail cleanly, never panic or allocate past the bound.
func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	WriteFrame(&buf, &Setup{Root: "/img", Hostname: "moat"})
	f.Add(buf.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Setup
		ReadFrame(bytes.NewReader(b), &s)
	})
}
