package effects

import (
	"regexp"
	"strings"
)

// secretRe matches paths that likely hold credentials. A heuristic: it
// errs on the side of naming a read, since a person judges the effect.
var secretRe = regexp.MustCompile(`(?i)(^|[/~'"\s=@])(\.ssh(/|$)|id_(rsa|dsa|ecdsa|ed25519)\b|\.aws/(credentials|config)|\.netrc|\.git-credentials|\.pgpass|\.npmrc|\.pypirc|\.docker/config\.json|\.kube/config|\.gnupg|/proc/[^/\s]+/environ|\.env(\.[a-z]+)?$|\.env['"\s]|/etc/shadow|\.config/gcloud|\.azure/|credentials\.json|\.vault-token|\.bash_history|\.mysql_history|secrets?\.(ya?ml|json|toml))`)

func isSecretPath(p string) bool {
	if p == "" || strings.Contains(p, ".env.example") || strings.HasSuffix(p, ".pub") {
		return false
	}
	return secretRe.MatchString(p)
}

// secretInText finds secret paths named inside program text.
func secretInText(code string) []string {
	var out []string
	for _, m := range secretRe.FindAllString(code, -1) {
		out = union(out, []string{strings.Trim(m, `'" =@`)})
	}
	return out
}

var persistRe = regexp.MustCompile(`(?i)(\.bashrc|\.bash_profile|\.bash_login|\.profile|\.zshrc|\.zprofile|\.zshenv|/etc/profile|/etc/bash\.bashrc|/etc/environment|/etc/cron|/var/spool/cron|crontab|/etc/systemd/|\.config/systemd/|/lib/systemd/system|/etc/init\.d/|/etc/rc\.local|authorized_keys|\.config/autostart|/etc/ld\.so\.preload|/etc/sudoers)`)

func isPersistPath(p string) bool {
	return persistRe.MatchString(p)
}
