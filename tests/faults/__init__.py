"""Fault injection: a real `moptd run` under each fault issue 8 lists. Every test checks that
the daemon keeps serving /metrics and the API, that the right finding or self-diagnosis
appears, and that nothing committed is lost."""
