package image

import (
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// fileSums remembers the sha256 of each regular file an import writes, taken
// as the bytes pass through the extractor, so that the tree digest
// (digest.go) need not read the whole tree back.
//
// The digest must stay exactly a function of the final tree, so a
// remembered sum is trusted only while the file provably still holds the
// bytes it was taken of. It is keyed by the inode (device and number) and
// vouched for by the stat fields any change of content alters: size, mtime
// and ctime, taken by fstat after the writer's last change to the file (its
// chmod and chown included). The listing uses it only when its own fresh
// lstat of the entry matches all of them exactly; anything else (a hard
// link a later layer adds, a chmod by finalize, a write by anyone) has a
// new ctime, and the file is read as it always was.
//
// Timestamps are only as fine as the kernel's clock tick (a second on
// filesystems with small inodes), and inode numbers are reused (ext4 hands
// a freed number to the next file created in the same group at once): a
// file deleted and another created in the same tick could match a
// record's inode, size and times with other bytes. So every regular file
// created in the tree during an import is either remembered anew by its
// writer (the extractor), which replaces the record of a reused inode
// number, or forgotten by it (finalize's replaceFile). And nothing writes
// into a file that already exists: every file is created with O_EXCL and
// written once, before it is remembered.
//
// A nil *fileSums remembers nothing and knows nothing (Build and the image
// builder hash every file, as before).
type fileSums struct {
	mu   sync.Mutex
	sums map[fileID]fileSum
}

// fileID names an inode.
type fileID struct{ dev, ino uint64 }

// fileSum is a remembered content hash and the stat fields that vouch for
// it.
type fileSum struct {
	size         int64
	mtime, ctime syscall.Timespec
	sum          [32]byte
}

func newFileSums() *fileSums { return &fileSums{sums: map[fileID]fileSum{}} }

// remember records sum as the content of the regular file st describes,
// taken by fstat after the writer's last change to it (which it will not
// change again).
func (s *fileSums) remember(st *syscall.Stat_t, sum []byte) {
	if s == nil {
		return
	}
	rec := fileSum{size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
	copy(rec.sum[:], sum)
	s.mu.Lock()
	s.sums[fileID{st.Dev, st.Ino}] = rec
	s.mu.Unlock()
}

// forget drops what is remembered of f's inode: f was created by a writer
// that does not hash, possibly at a number a remembered file had.
func (s *fileSums) forget(f *os.File) error {
	if s == nil {
		return nil
	}
	st, err := fstat(f)
	if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.sums, fileID{st.Dev, st.Ino})
	s.mu.Unlock()
	return nil
}

// lookup returns the hex sha256 remembered for the regular file st
// describes (a fresh lstat), if its inode, size, mtime and ctime are
// exactly as they were when it was remembered.
func (s *fileSums) lookup(st *syscall.Stat_t) (string, bool) {
	rec, ok := s.record(st)
	if !ok {
		return "", false
	}
	return hex.EncodeToString(rec.sum[:]), true
}

// vouches reports whether a sum is remembered for the regular file st
// describes, as lookup finds it: the file is as its writer left it.
func (s *fileSums) vouches(st *syscall.Stat_t) bool {
	_, ok := s.record(st)
	return ok
}

func (s *fileSums) record(st *syscall.Stat_t) (fileSum, bool) {
	if s == nil {
		return fileSum{}, false
	}
	s.mu.Lock()
	rec, ok := s.sums[fileID{st.Dev, st.Ino}]
	s.mu.Unlock()
	if !ok || rec.size != st.Size || rec.mtime != st.Mtim || rec.ctime != st.Ctim {
		return fileSum{}, false
	}
	return rec, true
}

func fstat(f *os.File) (*syscall.Stat_t, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("fstat %s: no unix stat data", f.Name())
	}
	return st, nil
}
