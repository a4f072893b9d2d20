package seccomp

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"golang.org/x/sys/unix"
)

// Program is a compiled filter as it travels to a sandbox's init (the
// native tier's setup frame, the microvm agent's request). In JSON it is
// one base64 string of the kernel's struct sock_filter array (8 bytes an
// instruction, little-endian), not an array of objects: init decodes it on
// every cold start, and a few hundred reflected objects cost a cold Go
// process a few tenths of a millisecond. Install checks whatever arrives.
type Program []unix.SockFilter

const insnBytes = 8

// MarshalJSON implements json.Marshaler.
func (p Program) MarshalJSON() ([]byte, error) {
	raw := make([]byte, 0, len(p)*insnBytes)
	for _, in := range p {
		raw = binary.LittleEndian.AppendUint16(raw, in.Code)
		raw = append(raw, in.Jt, in.Jf)
		raw = binary.LittleEndian.AppendUint32(raw, in.K)
	}
	return json.Marshal(raw) // []byte: base64
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *Program) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("seccomp program: want a base64 string: %w", err)
	}
	if s == nil {
		*p = nil
		return nil
	}
	raw, err := base64.StdEncoding.DecodeString(*s)
	if err != nil {
		return fmt.Errorf("seccomp program: %w", err)
	}
	if len(raw)%insnBytes != 0 || len(raw)/insnBytes > maxInsns {
		return fmt.Errorf("seccomp program: %d bytes is not a whole number of %d-byte instructions, at most %d of them", len(raw), insnBytes, maxInsns)
	}
	prog := make(Program, len(raw)/insnBytes)
	for i := range prog {
		r := raw[i*insnBytes:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(r), Jt: r[2], Jf: r[3], K: binary.LittleEndian.Uint32(r[4:])}
	}
	*p = prog
	return nil
}
