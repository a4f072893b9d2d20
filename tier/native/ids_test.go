package native

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestIDSlots: slots are distinct while held, by this process or another
// (open-file-description locks conflict between descriptions, whichever
// process holds them), and free again once released or once their holder
// is gone.
func TestIDSlots(t *testing.T) {
	old := IDSlotsFile
	IDSlotsFile = filepath.Join(t.TempDir(), "moat", "id-slots")
	t.Cleanup(func() { IDSlotsFile = old })

	held := map[int]*idSlot{}
	for range 200 {
		s, err := allocIDSlot()
		if err != nil {
			t.Fatal(err)
		}
		if held[s.slot] != nil {
			t.Fatalf("slot %d handed out twice", s.slot)
		}
		if b := s.base(); b < HostIDBase || b+idRange-1 > 0x7fffffff || (b-HostIDBase)%idRange != 0 {
			t.Fatalf("slot %d has base %#x, outside the native range", s.slot, b)
		}
		held[s.slot] = s
	}
	// Another process sees every held slot as taken: it reports the
	// slots it could take, never one of ours.
	cmd := exec.Command("python3", "-c", `
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
free = []
for slot in range(int(sys.argv[2])):
    lk = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, slot, 1, 0)
    try:
        fcntl.fcntl(fd, 37, lk)  # F_OFD_SETLK
        free.append(slot)
    except OSError:
        pass
print(" ".join(map(str, free)))
`, IDSlotsFile, strconv.Itoa(idSlots))
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("python3 to lock from another process: %v", err)
	}
	free := strings.Fields(string(out))
	if len(free) != idSlots-len(held) {
		t.Errorf("another process could take %d slots, want %d (all but ours)", len(free), idSlots-len(held))
	}
	for _, f := range free {
		n, _ := strconv.Atoi(f)
		if held[n] != nil {
			t.Errorf("another process could take our slot %d", n)
		}
	}
	for _, s := range held {
		s.release()
	}
	// Released, every slot can be taken again.
	var again []*idSlot
	for range idSlots {
		s, err := allocIDSlot()
		if err != nil {
			t.Fatalf("after release: %v", err)
		}
		again = append(again, s)
	}
	if _, err := allocIDSlot(); err == nil || !strings.Contains(err.Error(), "all") {
		t.Errorf("allocating past the last slot: %v, want an error saying all slots are in use", err)
	}
	for _, s := range again {
		s.release()
	}
	if _, err := os.Stat(IDSlotsFile); err != nil {
		t.Errorf("slots file: %v", err)
	}
}
