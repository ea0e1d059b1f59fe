"""A visual report of a crawl: ``scrapy catalog report -o report.html``.

``logread`` aggregates action logs, ``sources`` finds and reads catalogs and the hub,
``build`` collects them into a ``Report``, ``model`` computes every number and sentence
the page states, ``plots`` draws the figures, ``html`` lays out the page.
"""

from crawler.report.build import Report, ReportBuilder, report_settings, watch, write_atomic
from crawler.report.sources import ReportError

__all__ = ["Report", "ReportBuilder", "ReportError", "report_settings", "watch", "write_atomic"]
