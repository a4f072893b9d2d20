// Command vmagent is the microvm guest agent alone, for tests and for
// initramfs builds that should not carry the whole moat binary; moat
// itself runs the same agent when it starts as a guest's /init.
package main

import "github.com/moat-sandbox/moat/guest/vmagent"

func main() { vmagent.Main() }
