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
// Files are handed over in batches of writebackBatch: a channel send to a
// parked goroutine wakes its thread (a futex call, and in a VM an
// interrupt to the other CPU), and one per file cost more than the work
// it moved. At most writebackBatch*(writebackQueue+2) files are open here
// at once. The extractor hands a file over only once it is written, has
// its mode and owner and is remembered (filesums.go): nothing changes it
// here.
type writeback struct {
	batch   []*os.File // not yet handed over; the extractor's
	batches chan []*os.File
	done    chan struct{}
	err     error // the first close error; read after done is closed
}

const (
	writebackBatch = 16
	writebackQueue = 4
)

func newWriteback() *writeback {
	w := &writeback{batches: make(chan []*os.File, writebackQueue), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for batch := range w.batches {
			for _, f := range batch {
				_ = unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
				if err := f.Close(); err != nil && w.err == nil {
					w.err = fmt.Errorf("close %s: %w", f.Name(), err)
				}
			}
		}
	}()
	return w
}

// add hands f over, written and with its final mode and owner: writeback
// closes it.
func (w *writeback) add(f *os.File) {
	if w.batch == nil {
		w.batch = make([]*os.File, 0, writebackBatch)
	}
	w.batch = append(w.batch, f)
	if len(w.batch) == writebackBatch {
		w.batches <- w.batch
		w.batch = nil
	}
}

// wait closes the files still queued and returns the first close error.
// add must not be called after it.
func (w *writeback) wait() error {
	if len(w.batch) > 0 {
		w.batches <- w.batch
		w.batch = nil
	}
	close(w.batches)
	<-w.done
	return w.err
}
