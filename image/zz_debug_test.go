package image

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestZZDebugCancel(t *testing.T) {
	s := NewStore("/tmp/imgprobe/store")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			time.Sleep(500 * time.Millisecond)
			m, _ := mountsUnder("/tmp/imgprobe/store")
			if len(m) > 0 { t.Logf("mounts: %v", m) }
		}
	}()
	_, err := s.Build(ctx, "python", BuildOptions{Progress: os.Stdout})
	t.Logf("err: %v", err)
}
