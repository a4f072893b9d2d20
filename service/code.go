package service

import (
	"fmt"
	"strings"
)

// Command is the argv of a request's program: argv as it is, or code run
// by the interpreter of language (with the code as its -c argument; the
// image provides the interpreter). Every front door (the HTTP API's runs
// and execs, the MCP tools) decodes a program with it, so that they accept
// the same. The refusal names the field: argv, argv[i], code or language.
func Command(argv []string, code, language string) ([]string, *Error) {
	switch {
	case len(argv) > 0 && (code != "" || language != ""):
		return nil, InvalidField("code", "give either argv, or code with language; not both")
	case len(argv) > 0:
		for i, a := range argv {
			if strings.IndexByte(a, 0) >= 0 {
				return nil, InvalidField(fmt.Sprintf("argv[%d]", i), "contains a NUL byte, which no program can receive")
			}
		}
		if argv[0] == "" {
			return nil, InvalidField("argv[0]", "is empty; it names the program, e.g. \"python3\"")
		}
		return argv, nil
	case code == "" && language == "":
		return nil, InvalidField("argv", "is missing: give argv, e.g. [\"python3\", \"main.py\"], or code with language")
	case code == "":
		return nil, InvalidField("code", "is missing: language %s needs code to run", Quote(language))
	case strings.IndexByte(code, 0) >= 0:
		return nil, InvalidField("code", "contains a NUL byte, which no program can receive")
	}
	switch language {
	case "python":
		return []string{"python3", "-c", code}, nil
	case "bash", "sh":
		return []string{language, "-c", code}, nil
	case "":
		return nil, InvalidField("language", "is missing; accepted with code: python, bash, sh")
	}
	return nil, InvalidField("language", "%s is not supported; accepted: python, bash, sh (or give argv)", Quote(language))
}
