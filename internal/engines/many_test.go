package engines_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// busybox selects the small image for a container.
var busybox = map[string]any{"image": map[string]any{"image": busyboxImage}}

// manyPods is how many pods TestCRIManyPods starts at once (§3 of the
// scaling issue: 50 concurrent pods through CRI on one host).
const manyPods = 50

// TestCRIManyPods starts manyPods pods at once through the CRI, each
// with one container that prints its pod's name; all must succeed with
// the right output, and once all are removed nothing of any may be left
// (processes, mounts, cgroups, network namespaces).
func TestCRIManyPods(t *testing.T) {
	f := getFixture(t)
	for _, handler := range []string{"runc", "moat"} {
		t.Run(handler, func(t *testing.T) {
			f.needMoat(t, handler)
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			start := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var left []string
			errs := make([]error, manyPods)
			for i := range manyPods {
				wg.Add(1)
				go func() {
					defer wg.Done()
					name := fmt.Sprintf("many-%s-%d", handler, i)
					p, err := f.runPod(ctx, handler, name, nil)
					if err != nil {
						errs[i] = fmt.Errorf("runp: %w", err)
						return
					}
					netns, _ := p.netnsOf(ctx)
					errs[i] = func() error {
						id, err := p.start(ctx, "c", []string{"sh", "-c", "echo hello from " + name}, busybox)
						if err != nil {
							return err
						}
						if code, err := p.wait(ctx, id); err != nil || code != 0 {
							return fmt.Errorf("exit %d: %v", code, err)
						}
						if out, err := p.logs(ctx, id); err != nil || !strings.Contains(out, "hello from "+name) {
							return fmt.Errorf("logs %q, %v", out, err)
						}
						return nil
					}()
					if err := p.remove(ctx); err != nil && errs[i] == nil {
						errs[i] = fmt.Errorf("remove: %w", err)
					}
					if l := p.residue(netns); len(l) > 0 {
						mu.Lock()
						left = append(left, l...)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			failed := 0
			for i, err := range errs {
				if err != nil {
					failed++
					if failed <= 5 {
						t.Errorf("pod %d: %v", i, err)
					}
				}
			}
			t.Logf("%d concurrent pods with handler %s: %d succeeded, %d failed, in %.1f s", manyPods, handler, manyPods-failed, failed, time.Since(start).Seconds())
			if len(left) > 0 {
				t.Errorf("the removed pods left:\n  %s", strings.Join(left, "\n  "))
			}
			if out, err := f.cd.Crictl(ctx, "pods", "-q"); err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("pods still listed after removal: %q, %v", out, err)
			}
		})
	}
}
