"""Pages for browsing and triage: patterns, messages, one message.

Each page answers a normal request with the whole page and an htmx request with the partial it refreshes
(Django's template partials, `template#name`). Writes go through services and are checked for the role here.

patterns.py and messages.py hold the list pages (and listing.py what they share), message_detail.py and
message_edit.py one dead letter's pages, triage.py the writes of the patterns pages.
"""
