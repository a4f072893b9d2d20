package image

import (
	"io"
	"sync"
)

// readAhead reads a layer's decompressed stream in a goroutine of its own,
// a few blocks ahead of the extractor: inflating then runs beside the
// extraction's file-system calls on another core, as tar -xz runs gzip in
// a second process. It holds at most readAheadBlocks blocks, so a
// decompression bomb costs no more memory than a slow disk would.
type readAhead struct {
	full chan []byte // blocks read, in order
	free chan []byte // blocks the reader has finished with
	stop chan struct{}
	wg   sync.WaitGroup
	err  error  // the source's error; read only after full is closed
	cur  []byte // the block being read, from off
	off  int
}

const (
	readAheadBlocks    = 4
	readAheadBlockSize = 256 << 10
)

func newReadAhead(r io.Reader) *readAhead {
	ra := &readAhead{
		full: make(chan []byte, readAheadBlocks),
		free: make(chan []byte, readAheadBlocks),
		stop: make(chan struct{}),
	}
	for range readAheadBlocks {
		ra.free <- make([]byte, readAheadBlockSize)
	}
	ra.wg.Add(1)
	go func() {
		defer ra.wg.Done()
		defer close(ra.full)
		for {
			var buf []byte
			select {
			case buf = <-ra.free:
			case <-ra.stop:
				return
			}
			// Fill the block, keeping the source's error as it is (a
			// truncated gzip stream's io.ErrUnexpectedEOF is not an EOF).
			buf = buf[:cap(buf)]
			n, err := 0, error(nil)
			for n < len(buf) && err == nil {
				var m int
				m, err = r.Read(buf[n:])
				n += m
			}
			if n > 0 {
				ra.full <- buf[:n] // never blocks: as many slots as blocks
			}
			if err != nil {
				ra.err = err
				return
			}
		}
	}()
	return ra
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for ra.off == len(ra.cur) {
		if ra.cur != nil {
			ra.free <- ra.cur
			ra.cur = nil
		}
		buf, ok := <-ra.full
		if !ok {
			return 0, ra.err
		}
		ra.cur, ra.off = buf, 0
	}
	n := copy(p, ra.cur[ra.off:])
	ra.off += n
	return n, nil
}

// Close stops the goroutine and waits for it, so the source may be closed
// (or read by someone else) afterwards.
func (ra *readAhead) Close() {
	close(ra.stop)
	ra.wg.Wait()
}
