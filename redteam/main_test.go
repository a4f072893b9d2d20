package redteam

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/seccomp"
)

// filteredExecEnv makes this test binary install the native tier's seccomp
// filter and exec its arguments: what the microvm jailer does last, without
// the jail, to show the judge a filtered but unjailed VMM.
const filteredExecEnv = "MOAT_REDTEAM_FILTERED_EXEC"

func TestMain(m *testing.M) {
	if os.Getenv(filteredExecEnv) != "" {
		filteredExec(os.Args[1:])
	}
	os.Exit(m.Run())
}

func filteredExec(argv []string) {
	f, err := seccomp.Default().Compile()
	if err == nil {
		err = seccomp.Install(f)
	}
	if err == nil {
		err = syscall.Exec(argv[0], argv, nil)
	}
	fmt.Fprintln(os.Stderr, "filtered exec:", err)
	os.Exit(1)
}
