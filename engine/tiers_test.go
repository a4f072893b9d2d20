package engine

// The engine's tests run real sandboxes on the tiers registered here (the
// engine itself knows no tier by name: tier.Lookup).
import (
	_ "github.com/moat-sandbox/moat/tier/gvisor"
	_ "github.com/moat-sandbox/moat/tier/microvm"
	_ "github.com/moat-sandbox/moat/tier/native"
	_ "github.com/moat-sandbox/moat/tier/wasm"
)
