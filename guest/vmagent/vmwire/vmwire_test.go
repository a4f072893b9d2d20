package vmwire

import (
	"bytes"
	"errors"
	"testing"
)

func TestFrames(t *testing.T) {
	tests := []struct {
		name    string
		typ     byte
		payload []byte
		wantErr error
	}{
		{"empty", FrameTarEnd, nil, nil},
		{"small", FrameStdout, []byte("hello"), nil},
		{"largest", FrameTar, make([]byte, MaxFrame), nil},
		{"too large", FrameTar, make([]byte, MaxFrame+1), ErrFrameTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			err := WriteFrame(&b, tc.typ, tc.payload)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("WriteFrame: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			typ, p, err := ReadFrame(&b)
			if err != nil || typ != tc.typ || !bytes.Equal(p, tc.payload) && len(p)+len(tc.payload) > 0 {
				t.Fatalf("ReadFrame: %q %d bytes %v", typ, len(p), err)
			}
		})
	}
}

// FuzzReadFrame: whatever a guest sends, ReadFrame returns a bounded frame
// or an error, never a panic or an allocation over MaxFrame.
func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, FrameResult, []byte(`{"exit_code":0}`))
	f.Add(b.Bytes())
	f.Add([]byte{'O', 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{'T', 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			_, p, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(p) > MaxFrame {
				t.Fatalf("frame of %d bytes", len(p))
			}
		}
	})
}
