"""The tools a program calls, in the child: each call is a `call` frame to the zygote (which relays
it to the host, where the tool runs) answered by a `ret` frame with the same seq. The three search
primitives take one str; extra tools (sandbox.tools_module) take any JSON arguments, positionally.
"""

import _thread

from .protocol import frame, pack, unpack, write_all

MAX_TOOL_ARGS_CHARS = 64 * 1024  # lib/sandbox/tools.ts MAX_TOOL_ARGS_CHARS


def host_tools(msg, c2z_w, reader):
    """(the search primitives, the program's extra tools): name -> function, in the order the
    program's namespace lists them."""
    lock = _thread.allocate_lock()
    counter = [0]

    def call(name, arg, param):
        if not isinstance(arg, str):
            raise TypeError('%s(%s) expects a str, got %s' % (name, param, type(arg).__name__))
        return call_args(name, [arg])

    def call_args(name, args):
        with lock:
            counter[0] += 1
            seq = counter[0]
            body = pack({'t': 'call', 'seq': seq, 'name': name, 'args': args})
            # The host refuses more than MAX_TOOL_ARGS_CHARS per call (and records the refusal); a call
            # too large even for that (a character is at most 4 bytes) is refused here, unsent.
            if len(body) > 4 * MAX_TOOL_ARGS_CHARS + 4096:
                raise ValueError(
                    'the arguments of %s() are too large: at most %d characters per call, found more '
                    'than %d; pass a shorter query or id' % (name, MAX_TOOL_ARGS_CHARS, MAX_TOOL_ARGS_CHARS)
                )
            write_all(c2z_w, frame(body))
            while True:
                payload = reader.read_blocking()
                if payload is None:
                    raise RuntimeError('the connection to the search tools was closed')
                reply = unpack(payload)
                if reply.get('seq') == seq:
                    break
        if reply.get('ok'):
            return reply.get('value')
        etype = {'TypeError': TypeError, 'KeyError': KeyError, 'TimeoutError': TimeoutError, 'RuntimeError': RuntimeError}.get(
            reply.get('etype'), ValueError
        )
        raise etype(reply.get('error') or 'the search tool failed')

    def search_pages(query):
        return call('search_pages', query, 'query')

    def view_sections(page_id):
        return call('view_sections', page_id, 'page_id')

    def read_section(section_id):
        return call('read_section', section_id, 'section_id')

    search = {'search_pages': search_pages, 'view_sections': view_sections, 'read_section': read_section}
    # Extra tools (sandbox.tools_module): the host runs them; any JSON arguments, positional.
    extra = {}
    for tool_name in msg.get('extra_tools') or ():
        if isinstance(tool_name, str) and tool_name.isidentifier():

            def extra_tool(*args, _name=tool_name):
                return call_args(_name, list(args))

            extra_tool.__name__ = tool_name
            extra[tool_name] = extra_tool
    return search, extra
