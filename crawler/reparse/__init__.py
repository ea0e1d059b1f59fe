"""Re-parse: a spider's callbacks run again over stored records (uses Scrapy).

``plan`` selects catalog rows and cuts them into byte ranges, ``runner`` runs the
callbacks in worker processes, ``responses`` rebuilds the responses the crawl saw and
``feeds`` writes the items. ``scrapy reparse`` (commands/reparse.py) is the command.
"""
