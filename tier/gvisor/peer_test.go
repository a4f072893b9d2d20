package gvisor_test

// Some of these tests compare this tier with the native one, which the
// engine finds registered (tier.Lookup) once imported.
import _ "github.com/moat-sandbox/moat/tier/native"
