package egress

// Covers reports whether every destination o grants is also granted by r:
// a secret's hosts must lie inside the run's network.allow, so binding a
// secret never widens where the program may connect.
func (r Rule) Covers(o Rule) bool {
	ports := []int{o.Port}
	if o.Port == 0 {
		ports = []int{80, 443}
	}
	for _, p := range ports {
		if !r.matchesPort(p) {
			return false
		}
	}
	if !o.Wildcard {
		return r.matches(o.Host, ports[0])
	}
	// A wildcard is covered only by a wildcard over the same name or a
	// parent of it: "*.api.example.com" lies inside "*.example.com".
	return r.Wildcard && (o.Host == r.Host || len(o.Host) > len(r.Host)+1 && o.Host[len(o.Host)-len(r.Host)-1:] == "."+r.Host)
}

func (r Rule) matchesPort(p int) bool {
	if r.Port == 0 {
		return p == 80 || p == 443
	}
	return p == r.Port
}
