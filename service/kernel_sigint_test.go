package service

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKernelDriverSIGINTBetweenCells: SIGINTs that land while the driver
// is between cells (flushing a cell's output, sending its end, waiting
// for the next) interrupt nothing and never end the driver: the host
// interrupts a cell whose caller left or whose time ran out, racing with
// its end. Without the guard the driver's loop dies of KeyboardInterrupt
// and the context loses its state.
func TestKernelDriverSIGINTBetweenCells(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("needs python3 on the host to run the kernel driver")
	}
	cmd := exec.Command("python3", "-c", kernelDriver)
	cmd.Env = append(cmd.Environ(), "MOAT_KERNEL_PLAIN=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	frames := make(chan map[string]any, 64)
	go func() {
		defer close(frames)
		br := bufio.NewReader(stdout)
		for {
			head, err := br.ReadString('\n')
			if err != nil {
				return
			}
			n, err := strconv.Atoi(strings.TrimSuffix(head, "\n"))
			if err != nil {
				return
			}
			buf := make([]byte, n)
			if _, err := io.ReadFull(br, buf); err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal(buf, &m) == nil {
				frames <- m
			}
		}
	}()
	next := func(typ string) map[string]any {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case m, ok := <-frames:
				if !ok {
					t.Fatalf("the driver ended while waiting for %s; its stderr: %s", typ, stderr.String())
				}
				if m["type"] == typ {
					return m
				}
			case <-timeout:
				t.Fatalf("no %s frame in 20 s", typ)
			}
		}
	}
	send := func(id, code string) {
		t.Helper()
		data, _ := json.Marshal(map[string]string{"type": "execute", "id": id, "code": code})
		if _, err := io.WriteString(stdin, strconv.Itoa(len(data))+"\n"+string(data)); err != nil {
			t.Fatalf("writing cell %s: %v; stderr: %s", id, err, stderr.String())
		}
	}
	next("ready")
	send("c-0", "kept = 7")
	next("end")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
				cmd.Process.Signal(unix.SIGINT)
			}
		}
	}()
	for i := 1; i <= 200; i++ {
		send("c-"+strconv.Itoa(i), []string{"pass", "1", "1/0"}[i%3])
		next("end")
	}
	close(stop)
	wg.Wait()
	time.Sleep(50 * time.Millisecond) // a last signal in flight
	send("c-last", "kept")
	// The kernel survived with its state: the last cell's result is 7.
	res := next("result")
	if d, _ := res["data"].(map[string]any); d["text/plain"] != "7" {
		t.Errorf("kept after the SIGINTs: %v, want 7", res)
	}
}
