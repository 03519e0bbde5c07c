// Interop peer for zkgate integration tests: drives an Apache Curator DistributedAtomicLong
// through a line protocol on stdin/stdout.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorCounter <connectString> <path>
//
// stdout: READY once connected; VALUE <n> for "get" (the value now), for "add <delta>" (the
// value after the add) and for "adds <count>" (count adds of +1, one after another: the value
// after the last); FAILED when Curator gave up on an add; ERROR <message> on any exception.
// stdin: "get", "add <delta>", "adds <count>", "quit" (EOF behaves like quit).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.atomic.AtomicValue;
import org.apache.curator.framework.recipes.atomic.DistributedAtomicLong;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.curator.retry.RetryNTimes;

public class CuratorCounter {
    private static PrintStream out;

    private static void say(String line) {
        out.println(line);
        out.flush();
    }

    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 2) {
            say("ERROR usage: CuratorCounter <connectString> <path>");
            System.exit(1);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5))
                .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0]);
            System.exit(1);
        }
        // The optimistic loop's retries: contention with zkgate's adds makes some attempts fail.
        DistributedAtomicLong counter = new DistributedAtomicLong(client, args[1], new RetryNTimes(10_000, 1));
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            try {
                switch (words[0]) {
                    case "get": {
                        AtomicValue<Long> value = counter.get();
                        say(value.succeeded() ? "VALUE " + value.postValue() : "FAILED");
                        break;
                    }
                    case "add": {
                        AtomicValue<Long> value = counter.add(Long.parseLong(words[1]));
                        say(value.succeeded() ? "VALUE " + value.postValue() : "FAILED");
                        break;
                    }
                    case "adds": {
                        long count = Long.parseLong(words[1]);
                        long last = 0;
                        boolean failed = false;
                        for (long i = 0; i < count && !failed; i++) {
                            AtomicValue<Long> value = counter.increment();
                            failed = !value.succeeded();
                            last = value.postValue();
                        }
                        say(failed ? "FAILED" : "VALUE " + last);
                        break;
                    }
                    case "quit":
                        client.close();
                        return;
                    default:
                        say("ERROR unknown command: " + words[0]);
                }
            } catch (Exception e) {
                say("ERROR " + String.valueOf(e).replace('\n', ' '));
            }
        }
        client.close();
    }
}
