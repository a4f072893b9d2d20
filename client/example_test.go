package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/manifest"
)

// The examples need a running `moat serve` and a key from `moat keys
// create`, so they are compiled but not run by go test.

func Example() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:7070", os.Getenv("MOAT_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}

	// A one-shot run: a fresh sandbox, one program, destroyed afterwards.
	run, err := c.Run(ctx, &client.RunRequest{
		ManifestJSON: json.RawMessage(`{"resources": {"timeout": "10s", "memory": "256MiB"}}`),
		Argv:         []string{"python3", "main.py"},
		Files:        []client.File{{Path: "main.py", Content: []byte("print(6*7)\n")}},
	})
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		log.Fatalf("refused: %s (field %s)", apiErr.Message, apiErr.Field)
	} else if err != nil {
		log.Fatal(err)
	}
	out, _ := client.StreamBytes(run.Result.Stdout)
	fmt.Printf("%s, exit %d: %s", run.Result.Termination, run.Result.ExitCode, out)

	// A sandbox keeps its workspace across commands until it is deleted.
	sb, err := c.CreateSandbox(ctx, &client.SandboxRequest{TTL: 10 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Delete(context.Background())

	if err := sb.Upload(ctx, "data.csv", strings.NewReader("a,b\n1,2\n3,4\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	ex, err := sb.Exec(ctx, &client.ExecRequest{
		Code:     "import csv; rows = list(csv.DictReader(open('data.csv'))); open('sum.txt', 'w').write(str(sum(int(r['b']) for r in rows)))",
		Language: "python",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", ex.Result.ExitCode)

	// Start a long command and stream its output as it comes; a dropped
	// connection is resumed without losing or repeating output.
	ex, err = sb.Start(ctx, &client.ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done"}})
	if err != nil {
		log.Fatal(err)
	}
	done, err := sb.Stream(ctx, ex.ID, os.Stdout, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", done.Result.ExitCode)

	// Download what a command wrote.
	rc, err := sb.Download(ctx, "sum.txt")
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Close()
	io.Copy(os.Stdout, rc)
}

func ExampleSandbox_Events() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New("http://127.0.0.1:7070", os.Getenv("MOAT_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Delete(context.Background())

	ex, err := sb.Start(ctx, &client.ExecRequest{Argv: []string{"python3", "-u", "-c", "import time\nfor i in range(3): print(i); time.sleep(1)"}})
	if err != nil {
		log.Fatal(err)
	}
	st, err := sb.Events(ctx, ex.ID, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	for st.Next() {
		ev := st.Event()
		switch ev.Type {
		case client.EventStdout, client.EventStderr:
			fmt.Printf("%d %s: %s", ev.ID, ev.Type, ev.Data)
		case client.EventExit:
			fmt.Println("exit", ev.Exec.Result.ExitCode)
		}
	}
	if err := st.Err(); err != nil {
		log.Fatal(err)
	}
}

func ExampleSandbox_WriteStdin() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:7070", os.Getenv("MOAT_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	// A manifest built in Go: start from the defaults, then grant more.
	m := manifest.Default()
	m.Resources.SetTimeout(manifest.Duration(2 * time.Minute))
	sb, err := c.CreateSandbox(ctx, &client.SandboxRequest{Manifest: m})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Delete(context.Background())

	ex, err := sb.Start(ctx, &client.ExecRequest{Argv: []string{"python3", "-c", "import sys; print(sys.stdin.read().upper())"}, StdinOpen: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := sb.WriteStdin(ctx, ex.ID, strings.NewReader("hello\n")); err != nil {
		log.Fatal(err)
	}
	if err := sb.CloseStdin(ctx, ex.ID); err != nil {
		log.Fatal(err)
	}
	if _, err := sb.Stream(ctx, ex.ID, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// A client that waits longer for a busy server: up to 6 tries, 20 s per
// Retry-After and a minute in all. A refusal it did not wait out says in
// RetryAfter when the server expects the caller back.
func ExampleWithRetry() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:7070", os.Getenv("MOAT_API_KEY"),
		client.WithRetry(client.Retry{Attempts: 6, Backoff: time.Second, MaxDelay: 20 * time.Second, MaxWait: time.Minute}))
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Run(ctx, &client.RunRequest{Argv: []string{"true"}})
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.Code == client.CodeQuotaExceeded {
		log.Fatalf("still over quota; the server says retry in %v", apiErr.RetryAfter)
	}
}
