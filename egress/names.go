package egress

// maxChargedNames bounds the set of names already charged. A name not kept
// in it is charged again on its next lookup: memory stays bounded and the
// budget is never undercharged.
const maxChargedNames = 4096

// chargeName accounts for resolving host, a name that only a wildcard rule
// allows. Its first lookup costs len(host) bytes of the out budget and a
// token of the name rate; it returns "" when the lookup may go ahead, else
// the refusal reason (ReasonLimitNames, ReasonLimitBytes). A name looked up
// before costs nothing more: the resolver has seen it.
func (p *Proxy) chargeName(host string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.names[host]; ok {
		return ""
	}
	if !p.nameRate.allow(p.now()) {
		return ReasonLimitNames
	}
	if !p.out.takeAll(int64(len(host))) {
		return ReasonLimitBytes
	}
	if len(p.names) < maxChargedNames {
		p.names[host] = struct{}{}
	}
	p.lookups++
	p.lookupBytes += int64(len(host))
	return ""
}
