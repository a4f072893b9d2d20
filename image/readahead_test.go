package image

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"
)

func TestReadAhead(t *testing.T) {
	data := make([]byte, 3*readAheadBlockSize+12345)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	errBroken := errors.New("broken stream")
	tests := []struct {
		name    string
		src     io.Reader
		want    []byte
		wantErr error
	}{
		{"empty", bytes.NewReader(nil), nil, nil},
		{"several blocks", bytes.NewReader(data), data, nil},
		{"short reads", iotest.OneByteReader(bytes.NewReader(data[:5000])), data[:5000], nil},
		{"error after data", io.MultiReader(bytes.NewReader(data[:1000]), iotest.ErrReader(errBroken)), data[:1000], errBroken},
		{"truncated, not an EOF", io.MultiReader(bytes.NewReader(data[:1000]), iotest.ErrReader(io.ErrUnexpectedEOF)), data[:1000], io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ra := newReadAhead(tc.src)
			defer ra.Close()
			// Odd-sized reads, so block boundaries fall inside them.
			var got []byte
			buf := make([]byte, 7777)
			var err error
			for {
				var n int
				n, err = ra.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					break
				}
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("read %d bytes, not the source's %d", len(got), len(tc.want))
			}
			if tc.wantErr == nil && err != io.EOF || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("error %v; want %v", err, tc.wantErr)
			}
		})
	}
}

// An extractor that fails early closes the read-ahead with the source
// unread: Close must return (the goroutine gone) without draining it.
func TestReadAheadCloseEarly(t *testing.T) {
	ra := newReadAhead(io.LimitReader(zeroReader{}, 1<<40))
	if _, err := ra.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	ra.Close()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
