package engine

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/image"
)

// TestAutoBuildOnce: a call that finds an image missing while another
// automatic build holds the turn takes that build's result instead of
// building again (a fresh install's warm pool and first request), and a
// waiter's context still ends its wait.
func TestAutoBuildOnce(t *testing.T) {
	tests := []struct {
		name string
		// meanwhile runs while the call waits for its turn.
		meanwhile func(t *testing.T, s *image.Store)
		timeout   time.Duration
		wantErr   error
	}{
		{
			name: "built by the holder while waiting",
			meanwhile: func(t *testing.T, s *image.Store) {
				// The holder's build lands: the machine's python image,
				// linked into this store.
				if err := os.Symlink(filepath.Join(DefaultHome(), "images", "python"), filepath.Join(s.Dir, "python")); err != nil {
					t.Error(err)
				}
			},
			timeout: time.Minute,
		},
		{
			name:      "context ends the wait",
			meanwhile: func(*testing.T, *image.Store) {},
			timeout:   200 * time.Millisecond,
			wantErr:   context.DeadlineExceeded,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := image.NewStore(filepath.Join(DefaultHome(), "images")).Lookup("python"); err != nil {
				t.Skipf("needs the python image built (scripts/setup): %v", err)
			}
			d := t.TempDir()
			s := image.NewStore(filepath.Join(d, "images"))
			if err := os.MkdirAll(s.Dir, 0o700); err != nil {
				t.Fatal(err)
			}
			e := &Engine{opts: Options{Progress: io.Discard}, images: s, autoBuild: make(chan struct{}, 1)}

			e.autoBuild <- struct{}{} // another build holds the turn
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			type answer struct {
				img *image.Image
				err error
			}
			done := make(chan answer, 1)
			go func() {
				img, err := e.image(ctx, "python")
				done <- answer{img, err}
			}()
			time.Sleep(50 * time.Millisecond)
			tc.meanwhile(t, s)
			if tc.wantErr == nil {
				<-e.autoBuild // the holder's build ends
			}
			a := <-done
			if tc.wantErr != nil {
				if !errors.Is(a.err, tc.wantErr) {
					t.Fatalf("image() = %v, want %v", a.err, tc.wantErr)
				}
				return
			}
			if a.err != nil || a.img == nil || a.img.Name != "python" {
				t.Fatalf("image() = %+v, %v; want the image stored while it waited", a.img, a.err)
			}
		})
	}
}
