package image

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// writeback starts the writeback of each file the extractor has written,
// then closes it, on a goroutine of its own. sync_file_range does its work
// (block allocation, submitting the pages) in the calling thread, and the
// extractor's thread is an import's critical path, while the second core
// has time to spare beside inflating the layer. Starting each file's
// writeback early leaves the syncfs before publishing (pending.go) little
// to wait for; it is only a hint: the syncfs is what makes the tree
// durable.
//
// At most writebackQueue files wait here, open. The extractor hands a
// file over only once it is written, has its mode and owner and is
// remembered (filesums.go): nothing changes it here.
type writeback struct {
	files chan *os.File
	done  chan struct{}
	err   error // the first close error; read after done is closed
}

const writebackQueue = 64

func newWriteback() *writeback {
	w := &writeback{files: make(chan *os.File, writebackQueue), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for f := range w.files {
			_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
			if err := f.Close(); err != nil && w.err == nil {
				w.err = fmt.Errorf("close %s: %w", f.Name(), err)
			}
		}
	}()
	return w
}

// add hands f over, written and with its final mode and owner: writeback
// closes it.
func (w *writeback) add(f *os.File) { w.files <- f }

// wait closes the files still queued and returns the first close error.
// add must not be called after it.
func (w *writeback) wait() error {
	close(w.files)
	<-w.done
	return w.err
}
