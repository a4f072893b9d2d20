package main

// The tiers this binary offers: each registers itself with package tier
// when imported (tier.Register), and the engine finds it by name
// (tier.Lookup). A new tier is one more line here.
import (
	_ "github.com/moat-sandbox/moat/tier/gvisor"
	_ "github.com/moat-sandbox/moat/tier/microvm"
	_ "github.com/moat-sandbox/moat/tier/native"
	_ "github.com/moat-sandbox/moat/tier/wasm"
)
