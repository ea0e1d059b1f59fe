"""A visual report of a crawl: ``scrapy catalog report -o report.html``.

``logread`` aggregates action logs, ``sources`` finds and reads catalogs and the hub,
``plots`` draws the figures, ``html`` lays out the page, ``build`` ties them together.
"""

from crawler.report.build import Report, ReportBuilder, report_settings, watch, write_atomic
from crawler.report.sources import ReportError

__all__ = ["Report", "ReportBuilder", "ReportError", "report_settings", "watch", "write_atomic"]
