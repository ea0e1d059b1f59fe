"""Keys must never change: the fast path of canonical_url agrees with w3lib's."""

from __future__ import annotations

import hashlib
import random

from w3lib.url import canonicalize_url

from crawler.storage.keys import canonical_url, request_key, simple_canonical

# Pieces that look like the fast path's alphabet, and some that must leave it.
HOSTS = ["a.com", "www.example.org", "127.0.0.1", "x-y.z9", "A.com", "a.com.", "-a.com", "a..b"]
PORTS = ["", ":80", ":443", ":8080", ":0080", ":1", ":65535", ":38123", ":65536", ":99999", ":1e3"]
SEGMENTS = ["p", "P1.html", "a-b_c~d", "", ".", "..", ".x", "x.", "%41", "a b", "é", "a+b"]
QUERY = ["a", "b", "A", "", "1", "~", "-", "_", ".", "=", "%20", "+", "é", ";", "/"]


def _random_url(rng: random.Random) -> str:
    url = rng.choice(["http", "https", "HTTP"]) + "://" + rng.choice(HOSTS) + rng.choice(PORTS)
    if rng.random() < 0.9:
        url += "/" + "/".join(rng.choice(SEGMENTS) for _ in range(rng.randint(0, 4)))
    if rng.random() < 0.7:
        url += "?" + "&".join(
            "".join(rng.choice(QUERY) for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(0, 4))
        )
    if rng.random() < 0.05:
        url += "#frag"
    return url


def test_the_fast_path_agrees_with_w3lib_on_every_url_it_takes():
    rng = random.Random(20261130)
    taken = 0
    for _ in range(50_000):
        url = _random_url(rng)
        fast = simple_canonical(url)
        if fast is not None:
            taken += 1
            assert fast == canonicalize_url(url, keep_fragments=False), url
    assert taken > 2_000  # the fast path is really exercised


def test_known_canonical_forms():
    assert canonical_url("http://a.com") == "http://a.com/"
    assert canonical_url("http://a.com:80/p?b=2&a=1&a=0") == "http://a.com/p?a=0&a=1&b=2"
    assert canonical_url("https://a.com:443/p?&&x") == "https://a.com/p?x="
    assert canonical_url("http://A.com/./a/../b#f") == "http://a.com/b"
    assert canonical_url("http://a.com/p?a==b") == "http://a.com/p?a=%3Db"
    # Ports above 9999 (what a test server gets from the OS) take the fast path too.
    assert simple_canonical("http://127.0.0.1:38123/p?v=2&a") == "http://127.0.0.1:38123/p?a=&v=2"
    assert simple_canonical("http://a.com:65536/p") is None
    # The documented rule, pinned: sha256 of the canonical URL for GET.
    expected = hashlib.sha256(b"http://a.com/p?a=1&b=2").hexdigest()
    assert request_key("http://a.com:80/p?b=2&a=1") == expected
